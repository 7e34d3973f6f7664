"""Text <-> token ids for a checkpoint folder: `tokenizer.json` (Hugging Face `tokenizers`) or,
when there is none, a sentencepiece `tokenizer.model`.

`Tokenizer.from_dir` also reads `tokenizer_config.json` (special tokens, added tokens, the chat
template), `chat_template.jinja` (which overrides the config's template, as in transformers),
`generation_config.json` and `config.json` (extra end-of-sequence ids).

Added tokens (`<|im_start|>`, `<think>`, ...) always encode as single ids: the text is split on
them before the ordinary model sees it, in both backends. `encode` never adds a BOS token (Qwen
has none); callers that want one prepend it. This module knows nothing about chat rendering,
streaming or the model.
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path
from typing import Any

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
# How many characters of text one token can stand for, per character of its vocabulary entry:
# Unicode composition (NFC, NFKC) turns at most 4 characters into 1.
_COMPOSITION = 4
# Texts at least this long are encoded where the tokenizer lets other Python threads run (a
# server's event loop): `tokenizers`' `encode` holds the GIL for the whole text (seconds for a
# few megabytes), its `encode_batch` releases it while it works; the same ids.
_LONG_TEXT = 4096
# Characters one regex search over a text scans at most: each search is one C call that holds
# the GIL (a 30 MB text in one call held it for tens of milliseconds on a loaded machine).
_SEARCH_WINDOW = 1 << 16


def _token_text(value: Any) -> str | None:
    """A special-token entry of tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: Path) -> dict:
    """A JSON object file ({} when absent); ValueError naming the file when it is not one."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _check_tok_config(path: Path, cfg: dict) -> None:
    """The keys of tokenizer_config.json this loader reads have the types it reads; ValueError
    naming the file and the key otherwise (before a confusing failure further in)."""

    def bad(key: str, what: str) -> ValueError:
        return ValueError(f"{path}: {key!r} must be {what}, got {cfg[key]!r:.80}")

    for key in _SPECIAL_KEYS:
        if cfg.get(key) is not None and _token_text(cfg[key]) is None:
            raise bad(key, 'a string or {"content": string}')
    added = cfg.get("added_tokens_decoder")
    if added is not None:
        if not isinstance(added, dict):
            raise bad("added_tokens_decoder", "an object of token entries")
        for tid, entry in added.items():
            if _token_text(entry) is None:
                raise ValueError(
                    f"{path}: 'added_tokens_decoder.{tid}' must be "
                    f'{{"content": string, ...}}, got {entry!r:.80}'
                )
    template = cfg.get("chat_template")
    if template is not None and not isinstance(template, str):
        named = isinstance(template, list) and all(
            isinstance(t, dict)
            and isinstance(t.get("name"), str)
            and isinstance(t.get("template"), str)
            for t in template
        )
        if not named:
            raise bad("chat_template", 'a string or a list of {"name", "template"}')


class _HFBackend:
    """A `tokenizers.Tokenizer` loaded from tokenizer.json."""

    def __init__(self, path: Path, added: dict[str, bool]) -> None:
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as HFTokenizer

        self.tok = HFTokenizer.from_file(str(path))
        missing = [t for t in added if self.tok.token_to_id(t) is None]
        self.tok.add_special_tokens([AddedToken(t, special=added[t]) for t in missing])

    def encode(self, text: str) -> list[int]:
        if len(text) < _LONG_TEXT:
            return self.tok.encode(text, add_special_tokens=False).ids
        return self.tok.encode_batch([text], add_special_tokens=False)[0].ids  # GIL released

    def special_ids(self) -> set[int]:
        return {i for i, t in self.tok.get_added_tokens_decoder().items() if t.special}

    def added_ids(self) -> set[int]:
        return set(self.tok.get_added_tokens_decoder())

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.tok.id_to_token(token_id)

    def token_bytes(self) -> list[bytes]:
        added = {i: t.content for i, t in self.tok.get_added_tokens_decoder().items()}
        decoder = json.loads(self.tok.to_str()).get("decoder") or {}
        byte_level = "ByteLevel" in json.dumps(decoder)
        unbyte = {c: b for b, c in _bytes_to_unicode().items()}
        out: list[bytes] = []
        for i in range(self.vocab_size()):
            piece = self.tok.id_to_token(i)
            if i in added:
                out.append(added[i].encode())
            elif piece is None:
                out.append(b"")
            elif byte_level:
                out.append(bytes(unbyte.get(c, 0) for c in piece))
            else:
                out.append(_sp_piece_bytes(piece))
        return out


class _SPBackend:
    """A sentencepiece model. Text is split on the control pieces and the added tokens of
    tokenizer_config.json first, so that each encodes as one id (sentencepiece never matches
    control pieces in text; user-defined pieces it matches by itself). An added token whose id
    in `added_tokens_decoder` lies past the model's pieces (`ids`) extends the vocabulary: it
    encodes to that id and decodes to its text; ids between the pieces and it are empty."""

    def __init__(self, path: Path, added: dict[str, bool], ids: dict[str, int]) -> None:
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        n = self.sp.get_piece_size()
        self.atomic: dict[str, int] = {}
        for i in range(n):
            if self.sp.is_control(i):
                piece = self.sp.id_to_piece(i)
                if piece:
                    self.atomic[piece] = i
        self.extra: dict[int, str] = {i: t for t, i in ids.items() if i >= n}
        self.atomic.update({t: i for i, t in self.extra.items()})
        for t in added:
            if t not in self.atomic and self.sp.piece_to_id(t) != self.sp.unk_id():
                self.atomic[t] = self.sp.piece_to_id(t)
        # Longest first, so that a token that is a prefix of another never wins.
        alts = sorted(self.atomic, key=len, reverse=True)
        self.split_re = re.compile("|".join(map(re.escape, alts))) if alts else None
        self.longest = len(alts[0]) if alts else 0

    def special_ids(self) -> set[int]:
        n = self.sp.get_piece_size()
        return {i for i in self.atomic.values() if i < n and self.sp.is_control(i)}

    def added_ids(self) -> set[int]:
        return set(self.atomic.values())

    def encode(self, text: str) -> list[int]:
        # sentencepiece releases the GIL while it encodes; the split on the atomic tokens
        # searches the text a window at a time (`_atomic_matches`).
        ids: list[int] = []
        start = 0  # where the plain text not yet encoded begins
        for m in self._atomic_matches(text):
            if m.start() > start:
                ids.extend(self.sp.encode(text[start : m.start()]))
            ids.append(self.atomic[m.group()])
            start = m.end()
        if start < len(text):
            ids.extend(self.sp.encode(text[start:]))
        return ids

    def _atomic_matches(self, text: str):
        """The atomic tokens in `text`, left to right: the matches `split_re.finditer` gives,
        found by searches over at most `_SEARCH_WINDOW` characters each. A match is taken only
        when the window held every alternative at its start (`longest` characters) or reaches
        the text's end, so a window's end never cuts a token short; otherwise the next window
        starts at the first position this one could not test whole (its end less
        `longest - 1`)."""
        if self.split_re is None:
            return
        n, longest = len(text), self.longest
        window = max(_SEARCH_WINDOW, 2 * longest)
        pos = 0
        while pos < n:
            end = min(n, pos + window)
            m = self.split_re.search(text, pos, end)
            if m is not None and (end == n or m.start() + longest <= end):
                yield m
                pos = m.end()
            elif end == n:
                return
            else:
                pos = end - longest + 1

    def decode(self, ids: list[int]) -> str:
        # Control pieces decode to "" in sentencepiece; write their text like tokenizers does.
        # Ids past the vocabulary (padded embedding rows) decode to nothing, as in tokenizers.
        n = self.sp.get_piece_size()
        out: list[str] = []
        run: list[int] = []
        for t in ids:
            if t in self.extra or (0 <= t < n and self.sp.is_control(t)):
                out.append(self.sp.decode(run))
                out.append(self.id_to_token(t))
                run = []
            elif 0 <= t < n:
                run.append(t)
        out.append(self.sp.decode(run))
        return "".join(out)

    def vocab_size(self) -> int:
        return max(self.sp.get_piece_size(), max(self.extra, default=-1) + 1)

    def token_to_id(self, token: str) -> int | None:
        if token in self.atomic:
            return self.atomic[token]
        i = self.sp.piece_to_id(token)
        return i if self.sp.id_to_piece(i) == token else None

    def id_to_token(self, token_id: int) -> str | None:
        if token_id in self.extra:
            return self.extra[token_id]
        return self.sp.id_to_piece(token_id) if 0 <= token_id < self.sp.get_piece_size() else None

    def token_bytes(self) -> list[bytes]:
        sp = self.sp
        out: list[bytes] = []
        for i in range(sp.get_piece_size()):
            if sp.is_unknown(i) or sp.is_unused(i):
                out.append(b"")
            elif sp.is_control(i) or i in self.atomic.values():
                out.append(sp.id_to_piece(i).encode())
            else:
                out.append(_sp_piece_bytes(sp.id_to_piece(i)))
        out += [self.extra.get(i, "").encode() for i in range(len(out), self.vocab_size())]
        return out


def _sp_piece_bytes(piece: str) -> bytes:
    """A sentencepiece-style piece's bytes: `<0xNN>` is one byte, `▁` a space."""
    m = _BYTE_PIECE.fullmatch(piece)
    if m is not None:
        return bytes([int(m.group(1), 16)])
    return piece.replace("\u2581", " ").encode()


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: byte -> the printable character standing for it."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


class Tokenizer:
    """A checkpoint's tokenizer plus what tokenizer_config.json says about it.

    Attributes:
        chat_template: the Jinja template (a string, a dict of named templates, or None).
        special_tokens: {"bos_token": ..., "eos_token": ..., ...} for the template renderer.
        special_ids: ids that `decode(..., skip_special_tokens=True)` drops.
        added_ids: the ids of every added token, special or not (`<tool_call>`, `</think>`,
            the chat markers): the tokens a trimmed draft vocabulary keeps beside its first ids.
        eos_token_ids: every id that ends generation (config + generation_config + eos_token).
    """

    def __init__(
        self,
        backend: _HFBackend | _SPBackend,
        tok_config: dict,
        chat_template: str | dict[str, str] | None,
        extra_eos: list[int],
    ) -> None:
        self._b = backend
        self.chat_template = chat_template
        self.special_tokens: dict[str, str] = {}
        for key in _SPECIAL_KEYS:
            text = _token_text(tok_config.get(key))
            if text is not None:
                self.special_tokens[key] = text
        special = {t for t in self.special_tokens.values()}
        special.update(_added_tokens(tok_config, only_special=True))
        extra = tok_config.get("additional_special_tokens") or []
        special.update(t for t in map(_token_text, extra) if t)
        ids = {self.token_to_id(t) for t in special} | backend.special_ids()
        self.special_ids: frozenset[int] = frozenset(i for i in ids if i is not None)
        added = {self.token_to_id(t) for t in _added_tokens(tok_config, only_special=False)}
        added |= backend.added_ids()
        self.added_ids: frozenset[int] = self.special_ids | {i for i in added if i is not None}
        eos: list[int] = []
        eos_text = self.special_tokens.get("eos_token")
        eos_id = self.token_to_id(eos_text) if eos_text else None
        for i in [*extra_eos, *([eos_id] if eos_id is not None else [])]:
            if i not in eos:
                eos.append(i)
        self.eos_token_ids: tuple[int, ...] = tuple(eos)
        self._token_texts: dict[int, str] = {}  # `token_text`'s memo (at most the vocabulary)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load `path/tokenizer.json` (preferred) or `path/tokenizer.model`."""
        path = Path(path)
        tok_config = _read_json(path / "tokenizer_config.json")
        _check_tok_config(path / "tokenizer_config.json", tok_config)
        added = _added_tokens(tok_config, only_special=False)
        if (path / "tokenizer.json").is_file():
            backend: _HFBackend | _SPBackend = _HFBackend(path / "tokenizer.json", added)
        elif (path / "tokenizer.model").is_file():
            backend = _SPBackend(path / "tokenizer.model", added, _added_ids(tok_config))
        else:
            raise FileNotFoundError(f"no tokenizer.json or tokenizer.model in {path}")
        template: str | dict[str, str] | None = tok_config.get("chat_template")
        if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
            template = {t["name"]: t["template"] for t in template}
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        extra_eos: list[int] = []
        for cfg in (_read_json(path / "generation_config.json"), _read_json(path / "config.json")):
            for src in (cfg, cfg.get("text_config") or {}):
                value = src.get("eos_token_id")
                extra_eos.extend(
                    value if isinstance(value, list) else [value] * (value is not None)
                )
        return cls(backend, tok_config, template, extra_eos)

    # ---- the surface --------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no BOS/EOS is added. Added tokens in the text become their ids."""
        return self._b.encode(text)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; ids outside the vocabulary (padded embedding rows) are dropped."""
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.special_ids]
        return self._b.decode(list(ids))

    def token_text(self, token_id: int) -> str:
        """The text of one token alone (memoized: a reply with top logprobs asks for the same
        few thousand tokens tens of thousands of times)."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.decode([token_id])
        return text

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (the model's embedding may be larger)."""
        return self._b.vocab_size()

    def token_to_id(self, token: str) -> int | None:
        return self._b.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._b.id_to_token(token_id)

    @cached_property
    def token_bytes(self) -> tuple[bytes, ...]:
        """Each token id's bytes as it stands in generated text (added tokens: their text;
        unknown and unused pieces: empty). What a grammar engine matches tokens against."""
        return tuple(self._b.token_bytes())

    @cached_property
    def _token_chars(self) -> int:
        entries = (self.id_to_token(i) or "" for i in range(self.vocab_size))
        return max(map(len, entries), default=1) * _COMPOSITION

    def max_text_chars(self, tokens: int) -> int:
        """The longest text that could encode to `tokens` tokens or fewer: no token stands for
        more characters than its longest vocabulary entry has, times the composition factor (a
        lower bound on the tokens of any text, for a tokenizer that keeps the text's
        characters). A longer text is too long without encoding it (the one such bound: the
        server's completion prompts and every chat conversation are checked against it)."""
        return tokens * self._token_chars


def _added_tokens(tok_config: dict, only_special: bool) -> dict[str, bool]:
    """{content: special} from tokenizer_config.json's `added_tokens_decoder`."""
    out: dict[str, bool] = {}
    for entry in (tok_config.get("added_tokens_decoder") or {}).values():
        text = _token_text(entry)
        special = bool(entry.get("special", False)) if isinstance(entry, dict) else False
        if text and (special or not only_special):
            out[text] = special
    return out


def _added_ids(tok_config: dict) -> dict[str, int]:
    """{content: id} from tokenizer_config.json's `added_tokens_decoder` (keyed by id)."""
    out: dict[str, int] = {}
    for tid, entry in (tok_config.get("added_tokens_decoder") or {}).items():
        text = _token_text(entry)
        if text and str(tid).isdigit():
            out[text] = int(tid)
    return out
