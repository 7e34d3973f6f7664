"""The server's side of the engine: prompts rendered and validated, requests run as async streams.

One `LLM`, one engine thread; every HTTP request becomes one engine job. The job's sink puts
each event straight onto the asyncio loop (no thread per request), and a request whose
consumer goes away (client disconnect, server drain timeout) is cancelled on the engine at
once, queued or running: the engine publishes what it computed (spec: cancel publishes the
endpoint) and goes on serving everyone else. The driver uses the engine's thread-safe surface
(`submit`, `cancel`, `call`); this module is the one place that does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ninfer.engine import prompts as forms
from ninfer.engine.lane import Job
from ninfer.request import RequestOutput, SamplingParams, StreamDelta

ENGINE_CHECK_S = 0.5  # how often a waiting request checks that the engine thread still runs


@dataclass(slots=True)
class Rendered:
    prompt: forms.PromptInput
    text: str  # the rendered prompt text ("" for token-id prompts)

    @property
    def thinking(self) -> bool:
        """The generation prompt left the reply inside `<think>`: it starts with reasoning."""
        return self.text.rstrip(" ").endswith("<think>\n")


class _LoopSink:
    """A job sink that hands each event to an asyncio queue on the server's loop."""

    __slots__ = ("_loop", "queue")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:  # called on the engine thread
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def empty(self) -> bool:
        return self.queue.empty()


class EngineDriver:
    def __init__(self, llm, model_name: str, on_final=None) -> None:
        self.llm = llm
        self.model_name = model_name
        self.on_final = on_final  # called with every final RequestOutput, cancelled ones too
        self._ids = itertools.count()
        self._settling: set[asyncio.Task] = set()
        self.in_flight = 0

    # ---- prompts ------------------------------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self.llm.engine_config.max_model_len

    @property
    def tokenizer(self):
        return self.llm.tokenizer

    def render_chat(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        template_kwargs: dict,
        tool_breakpoint: bool = False,
    ) -> Rendered:
        """Render with the checkpoint's template; ValueError on a template error. With
        `tool_breakpoint` (cache_control on a tool), the end of the tools/system turn becomes a
        client breakpoint too."""
        template = self.llm._template
        if template is None:
            raise ValueError("messages: this model has no chat template")
        r = template.render(messages, tools=tools, **template_kwargs)
        h = r.hints
        explicit = set(h.explicit)
        if tool_breakpoint:
            explicit.update(h.structural)
        hints = forms.PromptHints(
            explicit=sorted(explicit),
            structural=list(h.structural),
            opener=h.opener,
            message_starts=list(h.message_starts),
        )
        return Rendered(forms.PromptInput(list(r.token_ids), hints), r.text)

    def render_prompt(self, prompt: str | list[int]) -> Rendered:
        p = forms.from_prompt(prompt, self.tokenizer)
        return Rendered(p, prompt if isinstance(prompt, str) else "")

    def validate(self, rendered: Rendered, params: SamplingParams) -> SamplingParams:
        """The frozen, checked copy of `params` the engine keeps; ValueError naming the field
        when the request cannot be served."""
        frozen = params.validated()
        forms.validate(rendered.prompt, self.llm._model_config.vocab_size, self.max_model_len)
        return frozen

    # ---- running ------------------------------------------------------------------------------
    async def run(
        self, rendered: Rendered, params: SamplingParams, stream: bool
    ) -> AsyncIterator[StreamDelta | RequestOutput]:
        """StreamDelta events (when `stream`), then the final RequestOutput. Leaving the
        iteration early (or being cancelled) cancels the job on the engine."""
        llm = self.llm
        engine = llm._engine
        sink = _LoopSink(asyncio.get_running_loop())
        prompt = rendered.prompt
        job = Job(
            request_id=f"srv-{next(self._ids)}",
            prompt=prompt.token_ids,
            params=params,
            hints=prompt.hints,
            sink=sink,  # type: ignore[arg-type]
            stream=stream,
        )
        if llm.engine_config.prefix_reuse:
            from ninfer.cache.keys import prepare_prompt

            job.blocks = prepare_prompt(prompt.token_ids)
        done = False
        self.in_flight += 1
        try:
            engine.submit(job)
            while True:
                event = await self._next(job, sink)
                if isinstance(event, RequestOutput):
                    done = True
                    self._final(event)
                    yield event
                    return
                yield event
        finally:
            self.in_flight -= 1
            if not done:
                engine.cancel(job)  # thread-safe; the engine settles and answers the sink
                task = asyncio.get_running_loop().create_task(self._settle(job, sink))
                self._settling.add(task)
                task.add_done_callback(self._settling.discard)

    async def _next(self, job: Job, sink: _LoopSink):
        """The job's next event; an "abort" output if the engine thread is gone."""
        while True:
            try:
                return await asyncio.wait_for(sink.queue.get(), ENGINE_CHECK_S)
            except TimeoutError:
                if not self.llm._engine._thread.is_alive() and sink.queue.empty():
                    return RequestOutput(
                        request_id=job.request_id,
                        prompt_token_ids=list(job.prompt),
                        finish_reason="abort",
                    )

    async def _settle(self, job: Job, sink: _LoopSink) -> None:
        """A cancelled job's final output, read for the accounting only."""
        while not isinstance(event := await self._next(job, sink), RequestOutput):
            pass
        self._final(event)

    def _final(self, out: RequestOutput) -> None:
        if self.on_final is not None:
            self.on_final(out)

    async def stats(self):
        return await asyncio.to_thread(self.llm.cache_stats)
