"""OpenTelemetry tracing: `Runtime(..., trace=OTelTracer())`.

Spans, built from the runtime's trace points (no other instrumentation):

- `duragent.task.run` — one per run of a task on a worker (a claim);
- `duragent.round` — one per round, inside its run;
- `chat {model}` — one per model call (GenAI semantic conventions:
  gen_ai.request.model, gen_ai.usage.input_tokens / output_tokens,
  gen_ai.response.finish_reasons);
- `execute_tool {name}` — one per tool call (gen_ai.tool.name,
  gen_ai.tool.call.id, duragent.tool.replay, duragent.tool.outcome).

Every run of one task, on any worker and after any restart, joins one trace:
the trace context active when the task was submitted (stored in the task's
config as `traceparent` at submit), or else a trace whose id is derived from
the task tree's root id. Only `opentelemetry-api` is used (extra `otel`); spans
go wherever the application's SDK sends them. Without OpenTelemetry installed
this module imports and does nothing (`current_trace_context()` is empty).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from duragent.errors import MissingExtra

try:  # guarded: the core install has no OpenTelemetry
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - exercised without the extra
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

TRACEPARENT = "traceparent"


def current_trace_context() -> dict[str, str]:
    """The active trace context as W3C headers ({} when none or no OpenTelemetry)."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in (TRACEPARENT, "tracestate")}


@dataclass
class _Run:
    span: Any
    round: Any = None
    model: Any = None
    tools: dict[str, Any] = field(default_factory=dict)


class OTelTracer:
    """A trace hook that turns a task's trace points into OpenTelemetry spans."""

    def __init__(self, tracer_provider: Any = None) -> None:
        if trace is None:
            raise MissingExtra("OpenTelemetry tracing", "otel")
        self.tracer = trace.get_tracer("duragent", tracer_provider=tracer_provider)
        self.runs: dict[str, _Run] = {}

    async def __call__(self, point: str, **info: Any) -> None:
        handler = getattr(self, f"_on_{point}", None)
        if handler is not None:
            handler(**info)

    # --- task runs ---

    def _parent(self, task: Any) -> Context:
        assert trace is not None
        carrier = {k: v for k, v in task.config.get("trace", {}).items() if isinstance(v, str)}
        if TRACEPARENT in carrier:
            return propagate.extract(carrier)
        # No submitter's trace: one trace per task tree, the same on every worker.
        digest = hashlib.sha256((task.root_id or task.id).encode()).digest()
        parent = trace.SpanContext(
            trace_id=int.from_bytes(digest[:16], "big") or 1,
            span_id=int.from_bytes(digest[16:24], "big") or 1,
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
        return trace.set_span_in_context(trace.NonRecordingSpan(parent))

    def _on_task_start(self, task_id: str, round: int, task: Any) -> None:
        old = self.runs.pop(task_id, None)
        if old is not None:
            self._end_run(old, "superseded")
        span = self.tracer.start_span(
            "duragent.task.run",
            context=self._parent(task),
            kind=trace.SpanKind.INTERNAL,
            attributes={
                "duragent.task.id": task.id,
                "duragent.task.root_id": task.root_id or task.id,
                "duragent.agent": task.agent,
                "duragent.task.restarts": task.restarts,
                "duragent.lease.epoch": task.lease.epoch,
                "duragent.worker": task.lease.owner or "",
                "duragent.round": round,
            },
        )
        self.runs[task_id] = _Run(span)

    def _on_task_end(self, task_id: str, round: int, task: Any) -> None:
        run = self.runs.pop(task_id, None)
        if run is not None:
            run.span.set_attribute("duragent.task.iterations", task.iterations)
            self._end_run(run, task.status.value, task.error)

    def _end_run(self, run: _Run, status: str, error: str | None = None) -> None:
        for span in (*run.tools.values(), run.model, run.round):
            if span is not None:
                span.end()
        run.span.set_attribute("duragent.task.status", status)
        if status == "failed":
            run.span.set_status(trace.Status(trace.StatusCode.ERROR, error or ""))
        run.span.end()

    def _child(self, run: _Run, name: str, attributes: dict[str, Any]) -> Span:
        parent = run.round or run.span
        ctx = trace.set_span_in_context(parent)
        return self.tracer.start_span(name, context=ctx, attributes=attributes)

    # --- rounds and model calls ---

    def _on_round_start(self, task_id: str, round: int) -> None:
        run = self.runs.get(task_id)
        if run is None:
            return
        if run.round is not None:
            run.round.end()
        run.round = None
        run.round = self._child(run, "duragent.round", {"duragent.round": round})

    def _on_model_start(self, task_id: str, round: int, model: str) -> None:
        run = self.runs.get(task_id)
        if run is None:
            return
        if run.model is not None:  # the previous attempt failed
            run.model.set_status(trace.Status(trace.StatusCode.ERROR, "model call failed"))
            run.model.end()
        run.model = self._child(
            run,
            f"chat {model}",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": model,
                "duragent.round": round,
            },
        )

    def _on_model_end(self, task_id: str, round: int, usage: Any, finish: str) -> None:
        run = self.runs.get(task_id)
        if run is None or run.model is None:
            return
        run.model.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        run.model.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        run.model.set_attribute("gen_ai.response.finish_reasons", [finish])
        run.model.end()
        run.model = None

    # --- tool calls ---

    def _on_step(self, task_id: str, round: int, call_id: str, step: str) -> None:
        run = self.runs.get(task_id)
        span = run.tools.get(call_id) if run is not None else None
        if span is not None:
            span.add_event("duragent.step", {"duragent.step.name": step})

    def _on_tool_start(
        self, task_id: str, round: int, call_id: str, tool: str, attempt: int, replay: str
    ) -> None:
        run = self.runs.get(task_id)
        if run is None:
            return
        run.tools[call_id] = self._child(
            run,
            f"execute_tool {tool}",
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": call_id,
                "duragent.tool.replay": replay,
                "duragent.tool.attempt": attempt,
            },
        )

    def _on_result(
        self, task_id: str, round: int, call_id: str, outcome: str, landed: Any = None
    ) -> None:
        run = self.runs.get(task_id)
        if run is None:
            return
        span = run.tools.pop(call_id, None)
        if span is None:  # decided from the log without running (e.g. interrupted)
            span = self._child(run, "execute_tool", {"gen_ai.tool.call.id": call_id})
        span.set_attribute("duragent.tool.outcome", outcome)
        if outcome not in ("ok",):
            span.set_status(trace.Status(trace.StatusCode.ERROR, outcome))
        span.end()


__all__ = ["OTelTracer", "current_trace_context"]
