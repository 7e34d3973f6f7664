"""The server's side of the engine: prompts rendered and validated, requests run as async streams.

One `LLM`, one engine thread; every HTTP request becomes one engine job. Its events reach the
asyncio loop through one bridge for all requests (no thread per request; about one loop
wake-up per engine step, not one per token per stream), and a request whose
consumer goes away (client disconnect, server drain timeout) is cancelled on the engine at
once, queued or running: the engine publishes what it computed (design §7.7: cancel publishes the
endpoint) and goes on serving everyone else. The driver uses the public `LLM` surface only
(`render_chat`, `render_prompt`, `check`, `submit` with a callback, `cancel`, `running`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from ninfer.request import RequestOutput, SamplingParams, StreamDelta

ENGINE_CHECK_S = 0.5  # how often a waiting request checks that the engine thread still runs
# Names the renderer passes itself: a template option of the same name would clash with them.
_RENDERER_NAMES = frozenset(
    {
        "self",
        "messages",
        "tools",
        "tools_breakpoint",
        "documents",
        "add_generation_prompt",
        "max_chars",
        "local_files",
    }
)


@dataclass(slots=True)
class Rendered:
    prompt: Any  # token ids and hints (`LLM.render_chat`, `LLM.render_prompt`)
    text: str  # the rendered prompt text ("" for token-id prompts)

    @property
    def thinking(self) -> bool:
        """The generation prompt left the reply inside `<think>`: it starts with reasoning."""
        return self.text.rstrip(" ").endswith("<think>\n")


class _Inbox:
    """One request's events on the loop, in order; `waiter` is set while its reader waits."""

    __slots__ = ("events", "waiter")

    def __init__(self) -> None:
        self.events: list[StreamDelta | RequestOutput] = []
        self.waiter: asyncio.Future | None = None

    def add(self, event: StreamDelta | RequestOutput) -> None:
        self.events.append(event)
        self.wake()

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class _Bridge:
    """Events from the engine thread to the server's loop, for every request at once.

    The engine emits one step's events back to back; the first event of a burst schedules one
    callback on the loop, later ones only join the list while that callback is pending. So
    the loop wakes about once per engine step, not once per token per stream, and each
    request's reader gets every event that arrived since it last looked. A watchdog on the
    loop wakes the readers when the engine thread has died (they answer "abort")."""

    def __init__(self, loop: asyncio.AbstractEventLoop, running) -> None:
        self.loop = loop
        self.thread = threading.get_ident()  # the loop's thread (its CPU time is measured)
        self.wakeups = 0  # callbacks run on the loop
        self._running = running  # () -> bool: the engine thread still runs
        self._lock = threading.Lock()
        self._items: list[tuple[_Inbox, StreamDelta | RequestOutput]] = []
        self._scheduled = False
        self._inboxes: set[_Inbox] = set()
        self._watch: asyncio.TimerHandle | None = None

    def open(self) -> _Inbox:
        inbox = _Inbox()
        self._inboxes.add(inbox)
        if self._watch is None:
            self._watch = self.loop.call_later(ENGINE_CHECK_S, self._check)
        return inbox

    def close(self, inbox: _Inbox) -> None:
        self._inboxes.discard(inbox)

    def put(self, inbox: _Inbox, event: StreamDelta | RequestOutput) -> None:
        """Called on the engine thread (`LLM.submit`'s `on_event`): never blocks on the loop."""
        with self._lock:
            self._items.append((inbox, event))
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        self.wakeups += 1
        for inbox, event in items:
            inbox.add(event)

    def _check(self) -> None:
        self._watch = None
        if not self._inboxes:
            return
        if not self._running():
            self._deliver()  # what the engine answered before it stopped comes first
            for inbox in self._inboxes:
                inbox.wake()
        self._watch = self.loop.call_later(ENGINE_CHECK_S, self._check)


def _merged(events: list[StreamDelta | RequestOutput]) -> list[StreamDelta | RequestOutput]:
    """A batch as at most one StreamDelta (its tokens and text joined, the first one's usage
    kept), then the final output."""
    deltas = [e for e in events if isinstance(e, StreamDelta)]
    rest = [e for e in events if not isinstance(e, StreamDelta)]
    if len(deltas) > 1:
        ids = [t for d in deltas for t in d.token_ids]
        text = "".join(d.text for d in deltas)
        first = deltas[0]
        deltas = [StreamDelta(first.request_id, token_ids=ids, text=text, usage=first.usage)]
    return deltas + rest


class EngineDriver:
    def __init__(self, llm, model_name: str, on_final=None) -> None:
        self.llm = llm
        self.model_name = model_name
        self.on_final = on_final  # called with every final RequestOutput, cancelled ones too
        self._settling: set[asyncio.Task] = set()
        self._bridge: _Bridge | None = None
        self.in_flight = 0

    # ---- prompts ------------------------------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self.llm.engine_config.memory.max_model_len

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the engine's KV pages hold: every reply of a request together must fit."""
        return self.llm.engine_config.memory.kv_capacity_tokens

    @property
    def tokenizer(self):
        return self.llm.tokenizer

    @property
    def supports_images(self) -> bool:
        """The model takes image content parts (it has a vision tower)."""
        return self.llm.supports_images

    def _max_text_chars(self) -> int | None:
        """The longest text that could fit in `max_model_len` tokens
        (`Tokenizer.max_text_chars`); None without a tokenizer."""
        tok = self.tokenizer
        return None if tok is None else tok.max_text_chars(self.max_model_len)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.llm.eos_token_ids

    @property
    def running(self) -> bool:
        """The engine thread still runs (the health check)."""
        return self.llm.running

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
        taken = sorted(_RENDERER_NAMES.intersection(template_kwargs))
        if taken:
            raise ValueError(f"chat_template_kwargs: {taken} cannot be set here")
        chat = self.llm.render_chat(
            messages, tools, tools_breakpoint=tool_breakpoint, local_files=False, **template_kwargs
        )
        return Rendered(chat.prompt, chat.text)

    def render_prompt(self, prompt: str | list[int] | dict) -> Rendered:
        """A completion prompt as token ids; ValueError naming the field. A text too long for
        any tokenization to fit `max_model_len` is refused before it is tokenized."""
        text = prompt.get("prompt") if isinstance(prompt, dict) else prompt
        limit = self._max_text_chars() if isinstance(text, str) else None
        if limit is not None and len(text) > limit:
            raise ValueError(
                f"prompt: {len(text)} characters is more than max_model_len="
                f"{self.max_model_len} tokens can hold"
            )
        p = self.llm.render_prompt(prompt)
        return Rendered(p, prompt if isinstance(prompt, str) else "")

    def validate(self, rendered: Rendered, params: SamplingParams) -> SamplingParams:
        """The frozen, checked copy of `params` the engine keeps; ValueError naming the field
        when the request cannot be served."""
        return self.llm.check(rendered.prompt, params)

    # ---- running ------------------------------------------------------------------------------
    @property
    def loop_stats(self) -> tuple[int, int] | None:
        """(the loop thread's id, loop wake-ups so far); None before the first request."""
        bridge = self._bridge
        return None if bridge is None else (bridge.thread, bridge.wakeups)

    def _bridge_here(self) -> _Bridge:
        loop = asyncio.get_running_loop()
        if self._bridge is None or self._bridge.loop is not loop:
            self._bridge = _Bridge(loop, lambda: self.llm.running)
        return self._bridge

    async def run(
        self, rendered: Rendered, params: SamplingParams, stream: bool
    ) -> AsyncIterator[list[StreamDelta | RequestOutput]]:
        """The request's events in batches, each everything that arrived since the previous
        one: at most one StreamDelta (when `stream`; the tokens of one or more engine steps,
        joined), and in the last batch the final RequestOutput. Leaving the iteration early (or
        being cancelled) cancels the request on the engine."""
        llm = self.llm
        bridge = self._bridge_here()
        inbox = bridge.open()
        done = False
        request_id = None
        self.in_flight += 1
        try:
            request_id = llm.submit(
                rendered.prompt, params, on_event=partial(bridge.put, inbox), stream=stream
            )
            while True:
                batch = _merged(await self._take(request_id, rendered, inbox))
                if isinstance(batch[-1], RequestOutput):
                    done = True
                    self._final(batch[-1])
                    yield batch
                    return
                yield batch
        finally:
            self.in_flight -= 1
            if done or request_id is None:
                bridge.close(inbox)
            else:
                llm.cancel(request_id)  # thread-safe; the engine settles and answers the sink
                task = asyncio.get_running_loop().create_task(
                    self._settle(request_id, rendered, bridge, inbox)
                )
                self._settling.add(task)
                task.add_done_callback(self._settling.discard)

    async def _take(self, request_id: str, rendered: Rendered, inbox: _Inbox) -> list:
        """Every event that arrived for the request (at least one); an "abort" output if the
        engine thread is gone."""
        while not inbox.events:
            inbox.waiter = asyncio.get_running_loop().create_future()
            try:
                await inbox.waiter
            finally:
                inbox.waiter = None
            if not inbox.events and not self.llm.running:
                return [
                    RequestOutput(
                        request_id=request_id,
                        prompt_token_ids=list(rendered.prompt.token_ids),
                        finish_reason="abort",
                    )
                ]
        events, inbox.events = inbox.events, []
        return events

    async def _settle(
        self, request_id: str, rendered: Rendered, bridge: _Bridge, inbox: _Inbox
    ) -> None:
        """A cancelled request's final output, read for the accounting only."""
        try:
            batch = await self._take(request_id, rendered, inbox)
            while not isinstance(batch[-1], RequestOutput):
                batch = await self._take(request_id, rendered, inbox)
        finally:
            bridge.close(inbox)
        self._final(batch[-1])

    def _final(self, out: RequestOutput) -> None:
        if self.on_final is not None:
            self.on_final(out)

    async def stats(self):
        return await asyncio.to_thread(self.llm.cache_stats)
