"""Model providers behind one streaming protocol, and `resolve_model("provider:name")`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from duragent.errors import InvalidOption
from duragent.llm._base import (
    ChatModel,
    Finish,
    ModelRequest,
    OutputSpec,
    Response,
    ResponseAssembler,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
)
from duragent.llm._scripted import ScriptedModel, ToolCall, Turn

if TYPE_CHECKING:
    from duragent.llm._anthropic import AnthropicChat  # noqa: F401
    from duragent.llm._openai import OpenAIChat  # noqa: F401

__all__ = [
    "ChatModel",
    "Finish",
    "ModelRequest",
    "OutputSpec",
    "Response",
    "ResponseAssembler",
    "ScriptedModel",
    "StreamEvent",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolSpec",
    "Turn",
    "UsageDelta",
    "resolve_model",
]


# The scripted models a spec may name; each answers "Done." (see ScriptedModel).
SCRIPTS = ("demo", "none")


def resolve_model(spec: str | ChatModel, **options: Any) -> ChatModel:
    """`"openai:gpt-4o-mini"`, `"anthropic:claude-..."`, `"scripted:demo"`, or a ChatModel."""
    if not isinstance(spec, str):
        return spec
    provider, sep, name = spec.partition(":")
    if not sep or not name:
        raise InvalidOption(
            f"model {spec!r} should be 'provider:model', e.g. 'openai:gpt-4o-mini', "
            "'anthropic:claude-sonnet-4-5' or 'scripted:demo'"
        )
    if provider == "scripted":
        if name not in SCRIPTS:
            known = ", ".join(f"scripted:{n}" for n in SCRIPTS)
            raise InvalidOption(
                f"unknown scripted model {spec!r}; the scripted models are {known} "
                "(for a script of your own, pass a ScriptedModel)"
            )
        return ScriptedModel([], name=spec, **options)
    if provider == "openai":
        from duragent.llm._openai import OpenAIChat

        return OpenAIChat(name, **options)
    if provider == "anthropic":
        from duragent.llm._anthropic import AnthropicChat

        return AnthropicChat(name, **options)
    raise InvalidOption(
        f"unknown model provider {provider!r} in {spec!r}; use openai, anthropic or scripted"
    )


# The provider adapters, for direct construction (a model string is the usual
# way). Imported on first use, so this package never loads a provider's SDK
# unless asked; not in __all__ for the same reason.
_ADAPTERS = {"OpenAIChat": "duragent.llm._openai", "AnthropicChat": "duragent.llm._anthropic"}


def __getattr__(name: str) -> Any:
    module = _ADAPTERS.get(name)
    if module is None:
        raise AttributeError(f"module 'duragent.llm' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
