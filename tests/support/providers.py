"""The `serve`/`chat` fixtures the provider tests share.

`provider_fixtures(*adapters)` builds, for a test module, a `provider` fixture
(parametrised when there are several adapters), `serve` (starts scripted servers
speaking that provider's wire format, closes them after the test), `chat` (the
adapter pointed at such a server, closed after the test) and an autouse fixture
that clears the provider's environment variables so a developer's key never
reaches a test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

import pytest

from duragent import ChatModel
from support.llm_servers import ScriptedServer


class ClosableModel(ChatModel, Protocol):
    async def aclose(self) -> None: ...


class Adapter(Protocol):
    """What the fixtures need to know of one provider."""

    @property
    def name(self) -> str: ...
    @property
    def server_type(self) -> type[ScriptedServer]: ...
    @property
    def env(self) -> tuple[str, ...]: ...
    def model(self, server: ScriptedServer, **options: Any) -> ClosableModel: ...


def provider_fixtures(*adapters: Adapter) -> tuple[Any, Any, Any, Any]:
    """(provider, serve, chat, clear_env) fixtures; assign them to module names."""
    params: list[Adapter] | None = list(adapters) if len(adapters) > 1 else None

    @pytest.fixture(name="provider", params=params, ids=lambda a: a.name)
    def provider(request: pytest.FixtureRequest) -> Adapter:
        return request.param if params else adapters[0]

    @pytest.fixture(name="serve")
    def serve(provider: Adapter) -> Iterator[Callable[..., ScriptedServer]]:
        servers: list[ScriptedServer] = []

        def start(turns: Any = (), **options: Any) -> ScriptedServer:
            server = provider.server_type(turns, **options)
            servers.append(server)
            server.start()
            return server

        yield start
        for server in servers:
            server.close()

    @pytest.fixture(name="chat")
    async def chat(provider: Adapter) -> AsyncIterator[Callable[..., ChatModel]]:
        models: list[ClosableModel] = []

        def make(server: ScriptedServer, **options: Any) -> ChatModel:
            model = provider.model(server, **options)
            models.append(model)
            return model

        yield make
        for model in models:
            await model.aclose()

    @pytest.fixture(name="_no_provider_env", autouse=True)
    def clear_env(monkeypatch: pytest.MonkeyPatch) -> None:
        for adapter in adapters:
            for var in adapter.env:
                monkeypatch.delenv(var, raising=False)

    return provider, serve, chat, clear_env
