"""Tools: Python callables with a JSON schema, a replay policy and a context."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, get_args, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from duragent.errors import InvalidOption, InvalidType, ToolArgumentError
from duragent.llm._base import ToolSpec
from duragent.runtime._context import ToolContext

# "never": an interrupted call is reported to the model, not re-run (the default).
# "safe": re-run after a crash; running it twice is harmless.
# "resume": re-run after a crash; steps it recorded with ctx.step are skipped.
Replay = Literal["never", "safe", "resume"]
ApprovalRule = bool | Callable[[dict[str, Any]], bool]


@dataclass
class Tool:
    """A callable the model may call. Build one with `@tool`."""

    name: str
    description: str
    fn: Callable[..., Any]
    parameters: dict[str, Any]
    args_model: type[BaseModel]
    context_param: str | None = None
    replay: Replay = "never"
    requires_approval: ApprovalRule = False
    timeout: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # Seconds an approval may stay open; then the call is denied ("no decision within ...").
    approval_timeout: float | None = None
    # What the tool may touch (workdir, permissions, network), set by duragent.toolsets;
    # pinned on each task of the agent (runtime/_pins.py).
    reach: dict[str, Any] | None = None
    # Its only effect is the wait it returns (the built-in ask_user): a call cut
    # off before its wait was committed is run again, whatever its replay policy.
    asks_only: bool = False

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def needs_approval(self, arguments: dict[str, Any]) -> bool:
        rule = self.requires_approval
        return bool(rule(arguments)) if callable(rule) else bool(rule)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            parsed = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ToolArgumentError(f"invalid arguments for {self.name}: {problems}") from exc
        return {name: getattr(parsed, name) for name in type(parsed).model_fields}

    async def invoke(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        kwargs = self.validate(arguments)
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        if inspect.iscoroutinefunction(self.fn):
            call: Awaitable[Any] = self.fn(**kwargs)
        else:
            # A sync tool runs in a thread so it never blocks the event loop.
            call = asyncio.to_thread(self.fn, **kwargs)
        if self.timeout is not None:
            return await asyncio.wait_for(call, self.timeout)
        return await call


def _is_context(annotation: Any) -> bool:
    """`ToolContext`, or `ToolContext | None`."""
    if annotation is ToolContext:
        return True
    return ToolContext in get_args(annotation)


def timeout_seconds(value: float | timedelta | None) -> float | None:
    """An approval time limit in seconds, from seconds or a timedelta."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not seconds > 0:
        raise InvalidOption(f"approval_timeout must be positive, not {value!r}")
    return seconds


def _describe(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The summary and per-parameter descriptions from a Google/numpy-ish docstring."""
    doc = inspect.getdoc(fn) or ""
    summary_lines, params = [], {}
    section = None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.lower() in ("args:", "arguments:", "parameters:", "params:"):
            section = "args"
            continue
        if stripped.lower() in ("returns:", "raises:", "yields:", "examples:"):
            section = "other"
            continue
        if section == "args" and ":" in stripped:
            name, _, text = stripped.partition(":")
            params[name.split("(")[0].strip()] = text.strip()
        elif section is None:
            summary_lines.append(line)
    return "\n".join(summary_lines).strip(), params


def make_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    replay: Replay = "never",
    requires_approval: ApprovalRule = False,
    timeout: float | None = None,
    approval_timeout: float | timedelta | None = None,
) -> Tool:
    if replay not in ("never", "safe", "resume"):
        raise InvalidOption(f"replay must be 'never', 'safe' or 'resume', not {replay!r}")
    hints = get_type_hints(fn)
    summary, param_docs = _describe(fn)
    fields: dict[str, Any] = {}
    context_param = None
    for pname, param in inspect.signature(fn).parameters.items():
        annotation = hints.get(pname, Any)
        if _is_context(annotation):
            context_param = pname
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise InvalidType(f"tool {fn.__name__}: *args/**kwargs cannot be described to a model")
        default = ... if param.default is inspect.Parameter.empty else param.default
        from pydantic import Field

        fields[pname] = (annotation, Field(default, description=param_docs.get(pname)))
    tool_name = name or fn.__name__
    args_model = create_model(f"{tool_name}_args", __config__=ConfigDict(extra="forbid"), **fields)
    schema = args_model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return Tool(
        name=tool_name,
        description=description or summary or tool_name,
        fn=fn,
        parameters=schema,
        args_model=args_model,
        context_param=context_param,
        replay=replay,
        requires_approval=requires_approval,
        timeout=timeout,
        approval_timeout=timeout_seconds(approval_timeout),
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    replay: Replay = "never",
    requires_approval: ApprovalRule = False,
    timeout: float | None = None,
    approval_timeout: float | timedelta | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    replay: Replay = "never",
    requires_approval: ApprovalRule = False,
    timeout: float | None = None,
    approval_timeout: float | timedelta | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a tool: `@tool` or `@tool(replay="safe")`.

    The JSON schema comes from the type hints, the description from the
    docstring. A parameter annotated `ToolContext` receives the call's context
    and is not shown to the model. `replay="safe"` declares that running the
    tool again after a crash is harmless; `replay="resume"` re-runs it after a
    crash with the steps it committed through `ctx.step` skipped; the default
    `"never"` means an interrupted call is reported to the model instead of
    being re-run. `requires_approval=True` (or a function of the arguments)
    parks the call until a person decides; with `approval_timeout` (seconds or
    a timedelta) an undecided call is denied once that time has passed.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return make_tool(
            f,
            name=name,
            description=description,
            replay=replay,
            requires_approval=requires_approval,
            timeout=timeout,
            approval_timeout=approval_timeout,
        )

    return wrap(fn) if fn is not None else wrap
