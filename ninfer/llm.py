"""The public facade (spec/API.md): `LLM(...)`, generate / chat / stream / cache_stats / close.

`LLM` turns user inputs into engine jobs and waits on their sinks; it knows nothing about
scheduling or the cache. Validation errors of a single request raise ValueError; inside a batch
they become that request's output with finish_reason "error".
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import itertools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ninfer.config import (
    EngineConfig,
    EngineOptions,
    check_fit,
    option_fields,
    probe_device,
    resolve,
    resolve_dtypes,
)
from ninfer.dtypes import torch_dtype
from ninfer.engine import prompts as forms
from ninfer.engine.engine import Engine
from ninfer.engine.executor.backend import select_ops
from ninfer.engine.outputs import is_engine_error
from ninfer.engine.request import Request
from ninfer.request import EngineError, RequestOutput, SamplingParams, StreamDelta

logger = logging.getLogger(__name__)


def _sampler(logits, params, generators):
    from ninfer.sampling import sample

    return sample(logits, params, generators)


def _load(options: EngineOptions, device: str):
    """(model config, tokenizer, chat template or None, weights builder, image processor or
    None: a checkpoint with a `vision_config` and a `preprocessor_config.json` loads its
    vision tower too)."""
    from ninfer.chat_template import ChatTemplate
    from ninfer.models.config import Qwen35Config
    from ninfer.tokenizer import Tokenizer

    mtp = options.speculative == "mtp"  # load the checkpoint's draft head too
    processor = None
    if options.model is None:
        from ninfer.demo import DEMO_DIR, demo_config, demo_weights_seed
        from ninfer.models.presets import build_random_model

        config, path = demo_config(), DEMO_DIR

        def build(dtype):
            return build_random_model(
                config, dtype, device, seed=demo_weights_seed,
                quantization=options.quantization, mtp=mtp,
            )  # fmt: skip
    else:
        from ninfer.models.weights import load_model

        path = Path(options.model)
        if not (path / "config.json").is_file():
            raise ValueError(f"model: {str(path)!r} is not a checkpoint folder (no config.json)")
        config = Qwen35Config.from_file(path)
        processor = _image_processor(path)
        vision = processor is not None

        def build(dtype):
            return load_model(path, dtype, device, options.quantization, mtp=mtp, vision=vision)

    tokenizer = Tokenizer.from_dir(path)
    template = ChatTemplate(tokenizer) if tokenizer.chat_template is not None else None
    return config, tokenizer, template, build, processor


def _quantize_draft(model, choice: str) -> None:
    """`draft_quantization`: the MTP head's projections to FP8, in place (a model handed to
    `LLM.from_model` keeps its FP8 head afterwards). ValueError naming speculative for a model
    without a head."""
    from ninfer.models.quant import on_the_fly
    from ninfer.models.quantize import quantize_draft_

    if getattr(model, "mtp", None) is None:
        raise ValueError("speculative='mtp': the model has no MTP draft head")
    quantize_draft_(model, on_the_fly(choice))


def _image_processor(path: Path):
    """The checkpoint's `ImageProcessorConfig` when it has a vision tower and a processor
    config, else None (a text-only load)."""
    from ninfer.models.vision import VisionConfig
    from ninfer.vision.preprocess import ImageProcessorConfig

    if not (path / "preprocessor_config.json").is_file() or VisionConfig.from_file(path) is None:
        return None
    return ImageProcessorConfig.from_file(path)


def _check_cache_file(options: EngineOptions) -> EngineOptions:
    """`prefix_cache_file` made absolute; ValueError for a directory or a missing parent."""
    if options.prefix_cache_file is None:
        return options
    from ninfer.persist.cache_file import resolve_path

    path = str(resolve_path(options.prefix_cache_file))
    return replace(options, prefix_cache_file=path)


class LLM:
    """An inference engine over one Qwen3.5 checkpoint (None: the embedded demo model)."""

    def __init__(self, model: str | None = None, **options: Any) -> None:
        """`model` and `options`: the keyword arguments of spec/API.md, each declared once, with
        its default and help, by `ninfer.config.EngineOptions` (the signature below is built
        from it); an unknown keyword raises TypeError, a bad value ValueError naming it."""
        opts = _options(model, options)
        facts = probe_device(opts.device)
        config, tokenizer, template, build, processor = _load(opts, facts.device)
        self._init(opts, facts, config, tokenizer, template, build, image_processor=processor)

    @classmethod
    def from_model(
        cls, model, tokenizer=None, chat_template=None, image_processor=None, **kwargs
    ) -> LLM:
        """An LLM over an already built `Qwen35ForCausalLM` (tests, benchmarks); its dtype and
        device must match the resolved options. `image_processor`: the `ImageProcessorConfig`
        of a model with a vision tower."""
        self = cls.__new__(cls)
        options = _options(None, kwargs)
        facts = probe_device(options.device)
        from ninfer.persist.fingerprint import model_identity

        self._init(
            options,
            facts,
            model.config,
            tokenizer,
            chat_template,
            lambda _dtype: model,
            identity=lambda: model_identity(model),
            image_processor=image_processor,
        )
        return self

    def _init(
        self, options, facts, config, tokenizer, template, build, identity=None,
        image_processor=None,
    ) -> None:  # fmt: skip
        t_start = time.perf_counter()
        options = _check_cache_file(options)
        on_cuda = facts.device.startswith("cuda")
        check_fit(options, config, on_cuda)  # before a long weight load
        dtypes = resolve_dtypes(options, on_cuda)  # (dtype, kv_dtype) names, once
        dtype = dtypes[0]
        model = build(torch_dtype(dtype))
        got = next(model.parameters()).dtype
        if got != torch_dtype(dtype):
            raise ValueError(f"dtype: the engine resolved {dtype}, the model's weights are {got}")
        if options.speculative is not None and options.draft_quantization is not None:
            _quantize_draft(model, options.draft_quantization)  # before memory is measured
        # Resolved once, with free memory measured with the weights in place: "auto" KV takes
        # what is left. Each value was checked on its own when `options` was built.
        self._cfg: EngineConfig = resolve(options, config, probe_device(facts.device), dtypes)
        self._model_config = config
        self._tokenizer = tokenizer
        self._template = template
        cfg = self._cfg
        device = torch.device(cfg.memory.device)
        from ninfer.models.quantize import weights_summary
        from ninfer.persist.cache_file import for_engine
        from ninfer.persist.fingerprint import path_identity
        from ninfer.sampling import make_generator

        self._weights = weights_summary(model)
        self._image_processor = image_processor
        self._supports_images = image_processor is not None and model.supports_images
        # a tower without a processor still reads a placeholder's row as a picture: refused
        self._vision_ids = _vision_ids(model) if getattr(model, "supports_images", False) else ()

        ops = select_ops(device, cfg.ops.compile, cfg.ops.op_choices)
        identity = identity or functools.partial(path_identity, cfg.model, cfg.quantization)
        # design §5.5, or None
        self._persist = for_engine(cfg.persistence, cfg.memory, config, ops, identity)
        try:
            self._engine = Engine(
                self._cfg,
                config,
                model,
                ops,
                tokenizer,
                _sampler,
                make_generator,
                persistence=self._persist,
            )
        except BaseException:
            if self._persist is not None:
                self._persist.release()
            raise
        from ninfer.structured import Grammars

        self._grammars = (  # structured outputs: compiled for the tokenizer on first use
            None if tokenizer is None else Grammars(tokenizer, config.vocab_size, self._engine.eos)
        )
        if self._persist is not None:  # a process that exits without close() still saves
            atexit.register(_close_at_exit, weakref.ref(self))
        self.startup_s = time.perf_counter() - t_start  # weights, pools, warm-up, graphs
        logger.info("ninfer: engine ready in %.2f s", self.startup_s)
        self._ids = itertools.count()
        self._live: dict[str, Request] = {}  # submitted, final output not yet read (for cancel)
        self._live_lock = threading.Lock()

    # ---- properties -------------------------------------------------------------------------
    @property
    def engine_config(self) -> EngineConfig:
        return self._cfg

    @property
    def model_config(self):
        """The model's normalised configuration (`Qwen35Config`: shape, vocabulary, limits)."""
        return self._model_config

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def image_processor(self):
        """The checkpoint's `ImageProcessorConfig` (None without a vision tower)."""
        return self._image_processor

    @property
    def supports_images(self) -> bool:
        """Whether the model takes image content parts (it has a vision tower); without one,
        every media part is refused with a ValueError naming it."""
        return self._supports_images

    @property
    def engine(self) -> Engine:
        """The inspection seam (docs/engine.md): the running `Engine`, for tests, benchmarks
        and tools, never applications. Its surface is not spec/API.md's."""
        return self._engine

    def weights_summary(self) -> dict:
        """The weights' quantisation, the modules left dense and their bytes, total and per
        decode token (`ninfer.models.quantize.weights_summary`; for `ninfer info`)."""
        return dict(self._weights)

    def memory_ledger(self) -> dict:
        """KV pages and bytes, state slots, Host slabs and bytes (for `ninfer info`)."""
        return self._engine.memory_ledger()

    def cache_stats(self):
        """A copy of the prefix cache's CacheStats (all zero when prefix_reuse=False)."""
        return self._engine.cache_stats()

    def speculation_stats(self):
        """A copy of the speculation counters (`engine.speculative.SpeculationStats`: verify
        rows, drafts proposed and accepted, tokens yielded; since the engine started), or None
        without `speculative`."""
        return self._engine.speculation_stats()

    def settle(self) -> None:
        """Block until every Host copy in flight (write-through, restores, prefetches) has
        landed and the cache knows it: what was served is then on the Host tier. The engine
        thread waits too (for at most the copies already queued); for benchmarks and tests."""
        self._engine.settle_copies()

    def check_idle(self) -> None:
        """AssertionError naming what is left unless no request runs or waits and nothing is
        pinned, reserved or leaked (`Engine.check_idle`); for tests, benchmarks and soaks."""
        self._engine.check_idle()

    def live_request_ids(self) -> list[str]:
        """The ids of the requests submitted whose final output is not read yet (each one
        `cancel` may still end)."""
        with self._live_lock:
            return list(self._live)

    # ---- requests ---------------------------------------------------------------------------
    def _job(
        self, prompt: forms.PromptInput | None, params, error: str | None, stream=False, sink=None,
        grammar=None,
    ) -> Request:  # fmt: skip
        ids = prompt.token_ids if prompt is not None else []
        hints = prompt.hints if prompt is not None else forms.PromptHints()
        return Request(
            request_id=f"req-{next(self._ids)}",
            prompt=ids,
            params=params,
            hints=hints,
            sink=queue.Queue() if sink is None else sink,
            stream=stream,
            error=error,
            grammar=grammar,
            images=prompt.images if prompt is not None else None,
        )

    def _prepare(self, make_input, params, single: bool, stream=False, field="prompt") -> Request:
        """Validate one request into a `Request`: ValueError naming the field when `single`, else
        one that finishes at once with that error. `params` are copied (frozen) here."""
        try:
            frozen = _checked_params(params)
            try:
                prompt = make_input()
            except ValueError as e:
                if any(name in str(e) for name in _INPUT_FIELDS):
                    raise
                raise ValueError(f"{field}: {e}") from e  # (say, the chat template's own)
            except Exception as e:  # a malformed value of the wrong type (TypeError, ...)
                raise ValueError(f"{field}: malformed input ({type(e).__name__}: {e})") from e
            self._check_prompt(prompt, field)
            grammar = self._compile(frozen)
        except ValueError as e:
            if single:
                raise
            return self._job(None, SamplingParams(), _error_text(e), stream)
        return self._job(prompt, frozen, None, stream, grammar=grammar)

    def _compile(self, params: SamplingParams):
        """The compiled grammar of `params.structured_outputs` with its thinking budget (None
        without either); ValueError naming the field when it cannot be compiled or enforced
        (compiled grammars are cached)."""
        spec, budget = params.structured_outputs, params.thinking_token_budget
        if spec is None and budget is None:
            return None
        if self._grammars is None:
            name = "structured_outputs" if spec is not None else "thinking_token_budget"
            raise ValueError(f"{name}: needs a tokenizer (this model has none)")
        return self._grammars.compile(spec, thinking_budget=budget)

    def _check_prompt(self, prompt: forms.PromptInput, field: str) -> None:
        forms.validate(
            prompt, self._model_config.vocab_size, self._cfg.memory.max_model_len,
            self._vision_ids,
        )  # fmt: skip
        if prompt.token_ids and any(  # a tokenizer or template returned non-int ids
            isinstance(t, bool) or not isinstance(t, int) for t in prompt.token_ids
        ):
            raise ValueError(f"{field}: rendered to token ids that are not integers")

    def _submit(self, job: Request) -> None:
        with self._live_lock:
            self._live[job.request_id] = job
        try:
            self._engine.submit(job)
        except BaseException:
            self._forget(job)
            raise

    def _forget(self, job: Request) -> None:
        with self._live_lock:
            if self._live.get(job.request_id) is job:
                del self._live[job.request_id]

    def cancel(self, request_id: str) -> bool:
        """Thread-safe: the request ends "abort" (what it committed stays cached). True when
        a live request had that id; False when it is unknown or already answered."""
        with self._live_lock:
            job = self._live.get(request_id)
        if job is None:
            return False
        self._engine.cancel(job)
        return True

    def _run_batch(self, jobs: list[Request], single: bool) -> list[RequestOutput]:
        submitted: list[Request] = []
        try:
            for job in jobs:
                self._submit(job)
                submitted.append(job)
            outs = [self._wait_final(job) for job in jobs]
        except BaseException:  # KeyboardInterrupt, or a submit refused: stop what runs
            for job in submitted:
                self._engine.cancel(job)
                self._forget(job)
            raise
        if single and outs[0].finish_reason == "error":
            _raise_for(outs[0])
        return outs

    def generate(self, prompts, sampling_params=None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. A single prompt that cannot be served raises
        ValueError naming the field (EngineError when the engine failed it); inside a list it
        comes back with finish_reason "error". Ctrl+C cancels the call's requests."""
        single = forms.is_single_prompt(prompts)
        items = [prompts] if single else _as_list(prompts, "prompts")
        params = _params_list(sampling_params, len(items))
        jobs = [
            self._prepare(lambda it=it: forms.from_prompt(it, self._tokenizer), p, single)
            for it, p in zip(items, params, strict=True)
        ]
        return self._run_batch(jobs, single)

    def chat(
        self, conversations, sampling_params=None, tools=None, enable_thinking: bool = True
    ) -> list[RequestOutput]:
        single = forms.is_conversation(conversations)
        items = [conversations] if single else _as_list(conversations, "conversations")
        params = _params_list(sampling_params, len(items))
        jobs = [
            self._prepare(
                lambda c=c: self._render(c, tools, enable_thinking), p, single, field="messages"
            )
            for c, p in zip(items, params, strict=True)
        ]
        return self._run_batch(jobs, single)

    def _render(self, messages, tools, enable_thinking) -> forms.PromptInput:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages: a conversation is a list of message dicts")
        return self.render_chat(messages, tools, enable_thinking=enable_thinking).prompt

    # ---- rendered prompts, submitted with a callback (servers) --------------------------------
    def render_chat(
        self, messages: list[dict], tools: list[dict] | None = None, *,
        tools_breakpoint: bool = False, local_files: bool = True, **template_kwargs: Any,
    ) -> ChatPrompt:  # fmt: skip
        """One conversation rendered with the checkpoint's chat template (`template_kwargs`,
        e.g. `enable_thinking`, go to the template): its token ids, the tap planner's hints
        (breakpoints after `cache_control` messages, the end of the tools/system turn, message
        starts, the generation opener) and the text. ValueError when the model has no
        template, when a content part carries a medium the model cannot take or an image that
        cannot be decoded (naming the part: `vision.parts.normalise_messages`), when the
        template rejects the conversation, or when its text alone is longer
        than any `max_model_len` tokens could hold (`Tokenizer.max_text_chars`): checked before
        it is encoded, and before it is rendered when its messages and tools already are
        (`chat_template.text_floor`). With `tools_breakpoint` (Anthropic's `cache_control` on a
        tool), the end of the tools/system turn is a client breakpoint. `local_files`: image
        parts may name files to read (a server passes False: its clients' paths are refused)."""
        from ninfer.chat_template import TooLong

        if self._template is None:
            raise ValueError("messages: this model has no chat template")
        messages, images = self._images(messages, local_files)
        max_len = self._cfg.memory.max_model_len
        max_chars = self._template.tokenizer.max_text_chars(max_len)
        try:  # a conversation no tokenization could fit is refused before it is encoded
            r = self._template.render(messages, tools, max_chars=max_chars, **template_kwargs)
        except TooLong as e:
            raise ValueError(
                f"messages: {e.chars} characters is more than max_model_len={max_len} tokens "
                "can hold"
            ) from None
        ids, prompt_images = list(r.token_ids), None
        if images:
            ids, prompt_images = self._expand_images(ids, images)
        at = prompt_images.shift if prompt_images is not None else list
        hints = _chat_hints(r.hints, at, tools_breakpoint)
        return ChatPrompt(forms.PromptInput(ids, hints, prompt_images), r.text)

    def _expand_images(self, ids: list[int], images: list):
        """(the ids with each image's pad tokens, its `PromptImages`): ValueError unless the
        template wrote one `<|image_pad|>` per image, or naming an image it cannot process."""
        from ninfer.engine.images import PromptImages
        from ninfer.vision.parts import IMAGE_PAD, check_placeholders

        pad_id = self._template.tokenizer.token_to_id(IMAGE_PAD)
        check_placeholders(ids, pad_id, len(images))
        return PromptImages.build(ids, pad_id, images, self._image_processor)

    def _images(self, messages: list, local_files: bool) -> tuple[list, list]:
        """(the messages as the template takes them, their decoded images in placeholder
        order): media parts refused without a vision tower, image parts decoded (files read
        with `local_files`), each naming its part (`ninfer.vision.parts`)."""
        from ninfer.vision.parts import normalise_messages, split_images

        if not isinstance(messages, list):
            return messages, []
        normalised = normalise_messages(messages, self._supports_images, local_files=local_files)
        return split_images(normalised)

    def render_prompt(self, prompt) -> forms.PromptInput:
        """One prompt in any of `generate`'s forms (text, token ids, a dict with
        `cache_breakpoints`) as token ids and hints; ValueError naming the field."""
        return forms.from_prompt(prompt, self._tokenizer)

    def check(self, prompt: forms.PromptInput, sampling_params=None) -> SamplingParams:
        """The frozen, validated copy of `sampling_params` that `submit` would run `prompt`
        with; ValueError naming the field when the request cannot be served."""
        frozen = _checked_params(sampling_params)
        self._check_prompt(prompt, "prompt")
        self._compile(frozen)
        return frozen

    def submit(
        self, prompt: forms.PromptInput, sampling_params=None, *,
        on_event: Callable[[StreamDelta | RequestOutput], None], stream: bool = True,
    ) -> str:  # fmt: skip
        """Start one rendered prompt (`render_chat`, `render_prompt`) and return its request
        id (for `cancel`). `on_event` is called on the engine thread with each StreamDelta
        (when `stream`), then exactly once with the final RequestOutput (finish_reason
        "abort" after `cancel`); it must not block: it hands the event on (to a queue, an
        event loop). A callback that raises fails its own request, never the engine: the
        request is cancelled (what it computed stays cached), later deltas are dropped, and
        its final output is offered once more with finish_reason "error" naming the
        callback's exception. ValueError naming the field when the request cannot be served
        (`check`); nothing is submitted then."""
        frozen = self.check(prompt, sampling_params)
        sink = _CallbackSink(on_event)
        job = self._job(prompt, frozen, None, stream, sink=sink, grammar=self._compile(frozen))
        sink.on_final = lambda: self._forget(job)
        sink.on_raise = lambda: self._engine.cancel(job)
        self._submit(job)
        return job.request_id

    @property
    def running(self) -> bool:
        """True while the engine serves: False from the moment it is closing or has failed
        (a request then still gets its final output: "abort", or "error" naming the fault),
        and whenever its thread is gone."""
        engine = getattr(self, "_engine", None)
        return engine is not None and engine.serving

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The token ids that end a reply (the tokenizer's and the checkpoint's)."""
        return frozenset(self._engine.eos)

    def stream(
        self,
        prompt_or_messages,
        sampling_params=None,
        tools=None,
        enable_thinking: bool = True,
    ) -> RequestStream:
        """Token deltas, then the final RequestOutput. The request is submitted at once; its id
        is `.request_id` (for `cancel`). Closing the iterator early, from any thread, cancels
        the request (finish_reason "abort"); what it committed stays cached."""
        params = SamplingParams() if sampling_params is None else sampling_params
        item = prompt_or_messages
        conversation = forms.is_conversation(item)
        make = (
            (lambda: self._render(item, tools, enable_thinking))
            if conversation
            else (lambda: forms.from_prompt(item, self._tokenizer))
        )
        field = "messages" if conversation else "prompt"
        job = self._prepare(make, params, True, True, field=field)
        self._submit(job)
        return RequestStream(self, job)

    def _wait_final(self, job: Request) -> RequestOutput:
        while True:
            event = self._engine.next_event(job)
            if isinstance(event, RequestOutput):
                self._forget(job)
                return event

    # ---- lifetime ---------------------------------------------------------------------------
    def close(self, save: bool = True) -> None:
        """Orderly stop: running and queued requests end as "abort", their committed blocks are
        written through, then with `prefix_cache_file` (and `save`) the Host tier is saved
        (design §5.5). Blocks until the save ended; idempotent."""
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close(save=save)
        persist = getattr(self, "_persist", None)
        if persist is not None:
            persist.release()  # after the save: another engine may take the file now

    def abandon_save(self, wait_s: float | None = None) -> bool:
        """Thread-safe (a second Ctrl+C): a save not begun never begins; a running one stops
        before its next slab batch or its rename and deletes its temporary file, so the previous
        file stays. Waits up to `wait_s` seconds (None: not at all) for the engine to stop;
        True once it has stopped."""
        persist = getattr(self, "_persist", None)
        if persist is not None:
            persist.abandon()
        engine = getattr(self, "_engine", None)
        if engine is None:
            return True
        if wait_s is not None:
            return engine.join(wait_s)
        return engine.stopped

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class ChatPrompt(NamedTuple):
    """A conversation as `LLM.render_chat` rendered it."""

    prompt: forms.PromptInput  # token ids and the tap planner's hints
    text: str  # the rendered text


class _CallbackSink:
    """A job's sink that hands each event to a callback on the engine thread (`LLM.submit`);
    `on_final` runs before the final output is handed on.

    The callback is the caller's code running on the engine thread, so whatever it raises
    stops here: the first raise is logged and `on_raise` cancels the request (the engine frees
    its lane and publishes what it computed); later deltas are dropped, and the final output
    is offered once more, as finish_reason "error" naming the exception. A raise on that
    offer, or on a final output, is dropped: the callback is never retried."""

    __slots__ = ("_on_event", "on_final", "on_raise", "_raised")

    def __init__(self, on_event: Callable[[StreamDelta | RequestOutput], None]) -> None:
        self._on_event = on_event
        self.on_final: Callable[[], None] | None = None
        self.on_raise: Callable[[], None] | None = None
        self._raised: str | None = None  # what the callback raised first

    def put(self, event: StreamDelta | RequestOutput) -> None:
        final = isinstance(event, RequestOutput)
        if final and self.on_final is not None:
            self.on_final()
        if self._raised is not None:
            if not final:
                return
            event = replace(event, finish_reason="error", error=self._raised)
        try:
            self._on_event(event)
        except BaseException as e:  # noqa: BLE001 - nothing a caller raises ends the engine
            if self._raised is not None:
                return
            detail = f": {e}" if str(e) else ""
            self._raised = f"on_event raised {type(e).__name__}{detail}"
            logger.warning(
                "ninfer: %s's on_event raised %s%s; the request %s",
                event.request_id,
                type(e).__name__,
                detail,
                "ended without its final output" if final else "is cancelled",
                exc_info=e,
            )
            if not final and self.on_raise is not None:
                self.on_raise()


# Field names a request's input error may name (else it is prefixed with the form's field).
def _chat_hints(h, at: Callable, tools_breakpoint: bool) -> forms.PromptHints:
    """The template's hints as the engine takes them: positions moved by `at` (past expanded
    image pads), the end of the tools/system turn a client breakpoint with
    `tools_breakpoint`."""
    explicit = set(at(h.explicit))
    if tools_breakpoint:
        explicit.update(at(h.structural))
    return forms.PromptHints(
        explicit=sorted(explicit),
        structural=at(h.structural),
        opener=None if h.opener is None else at([h.opener])[0],
        message_starts=at(h.message_starts),
        output_after=h.output_after,
        output_before=h.output_before,
    )


def _vision_ids(model) -> tuple[int, ...]:
    """The token ids only a prompt with images may hold (the tower's config)."""
    tower = model.model.visual
    if tower is None:
        return ()
    c = tower.config
    ids = (c.image_token_id, c.video_token_id, c.vision_start_token_id, c.vision_end_token_id)
    return ids


_INPUT_FIELDS = ("prompt", "messages", "cache_breakpoints", "tools", "max_model_len")


def _close_at_exit(ref: weakref.ref) -> None:
    """atexit: close (and so save) an LLM with a prefix_cache_file that was never closed. Holds
    a weak reference only: registering does not keep the LLM alive."""
    llm = ref()
    if llm is not None:
        with contextlib.suppress(Exception):
            llm.close()


def _options(model: str | None, kwargs: dict) -> EngineOptions:
    names = {f.name for f, _ in option_fields()} - {"model"}
    unknown = set(kwargs) - names
    if unknown:
        raise TypeError(f"LLM() got unexpected keyword arguments {sorted(unknown)}")
    return EngineOptions(model=model, **kwargs)


def _init_signature() -> inspect.Signature:
    """`LLM.__init__`'s signature as `inspect` and `help()` show it: every `EngineOptions` field
    with its default (`model` also positional, the rest keyword-only)."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for f, _ in option_fields():
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        if f.name != "model":
            kind = inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter(f.name, kind, default=f.default, annotation=f.type))
    return inspect.Signature(params, return_annotation="None")


def _params_list(sampling_params, n: int) -> list:
    """One entry per prompt (each checked per request by `_checked_params`)."""
    if sampling_params is None:
        return [SamplingParams() for _ in range(n)]
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    params = _as_list(sampling_params, "sampling_params")
    if len(params) != n:
        raise ValueError(f"sampling_params: {len(params)} given for {n} prompts")
    return params


def _as_list(items, name: str) -> list:
    if isinstance(items, (str, bytes, dict)) or not hasattr(items, "__iter__"):
        raise ValueError(f"{name}: expected a list, got {type(items).__name__}")
    return list(items)


def _checked_params(params) -> SamplingParams:
    """A validated, frozen copy of one request's SamplingParams (ValueError naming the field)."""
    if params is None:
        params = SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling_params: expected SamplingParams, got {type(params).__name__}")
    return params.validated()


def _error_text(e: ValueError) -> str:
    text = str(e)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a message quoting a lone surrogate: keep it printable
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _raise_for(out: RequestOutput):
    """A single-prompt call's failure: EngineError for an engine fault, else ValueError."""
    if is_engine_error(out):
        raise EngineError(out.error)
    raise ValueError(out.error)


class RequestStream:
    """The iterator `LLM.stream` returns: StreamDelta events, then the final RequestOutput.

    `close()` may be called from any thread: from the iterating thread (or with no iteration in
    progress) it cancels the request and waits until it is settled (published, released);
    from another thread while `next()` blocks it cancels, and the iterating thread then gets
    the final "abort" output and the iteration ends."""

    def __init__(self, llm: LLM, job: Request) -> None:
        self._llm = llm
        self._job = job
        self._lock = threading.Lock()  # held by whoever reads the job's events
        self._done = False
        self.request_id = job.request_id

    def __iter__(self) -> RequestStream:
        return self

    def __next__(self) -> StreamDelta | RequestOutput:
        with self._lock:
            if self._done:
                raise StopIteration
            try:
                event = self._llm._engine.next_event(self._job)
            except BaseException:
                self._llm._engine.cancel(self._job)  # Ctrl+C while waiting
                raise
            if isinstance(event, RequestOutput):
                self._done = True
                self._llm._forget(self._job)
                if event.finish_reason == "error":
                    _raise_for(event)
            return event

    def close(self) -> None:
        if self._done:
            return
        self._llm._engine.cancel(self._job)
        if not self._lock.acquire(blocking=False):
            return  # another thread is reading: it gets the "abort" output
        try:
            if not self._done:
                self._llm._wait_final(self._job)  # settled before close() returns
                self._done = True
        finally:
            self._lock.release()

    def __enter__(self) -> RequestStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if not self._done:
                self._llm._engine.cancel(self._job)
                self._llm._forget(self._job)


LLM.__init__.__signature__ = _init_signature()
