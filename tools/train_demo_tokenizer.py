"""Build the demo model's tokenizer assets in ninfer/demo/assets/.

    python tools/train_demo_tokenizer.py [--vocab 2560] [--regen-corpus]

1. corpus.txt: plain English written procedurally from the word lists below (seeded, so the
   file is reproducible and free to ship). It is only regenerated with --regen-corpus.
2. tokenizer.model: a sentencepiece BPE model trained on it, byte_fallback=True, no dummy
   prefix, identity normalisation, with Qwen's chat tokens as user-defined symbols.
3. tokenizer_config.json: special tokens and the Qwen3.5 chat template
   (tests/fixtures/qwen3_5_chat_template.jinja).
4. config.json: the tiny qwen3_5_text config; vocab_size = pieces rounded up to 64.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "ninfer" / "demo" / "assets"
TEMPLATE = ROOT / "tests" / "fixtures" / "qwen3_5_chat_template.jinja"
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
CONTROL = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}  # special=True, as in Qwen


def _words(text: str) -> list[str]:
    return text.split()


NOUNS = _words(
    """
time year people way day man woman child world life hand part place case week company
system program question work government number night point home water room mother area money
story fact month lot right study book eye job word business issue side kind head house service
friend father power hour game line end member law car city community name president team minute
idea kid body information back parent face others level office door health person art war
history party result change morning reason research girl guy moment air teacher force education
river mountain forest garden window table letter village market bridge engine cache memory token
model server request answer library planet ocean island bird horse song picture machine kitchen
question signal pattern number network storm harbor lantern valley meadow winter summer autumn
spring battery circuit compiler kernel thread buffer packet schedule journey castle museum"""
)
VERBS = _words(
    """
find tell ask work seem feel try leave call keep let begin show hear play run move like
live believe hold bring happen write provide sit stand lose pay meet include continue set learn
change lead understand watch follow stop create speak read allow add spend grow open walk win
offer remember love consider appear buy wait serve rest send expect build stay fall cut reach
fix remain suggest raise pass sell require report decide pull carry explain compute measure
cache restore evict store paint climb cross gather answer travel repair borrow visit"""
)
ADJS = _words(
    """
good new first last long great little own other old right big high different small
large next early young important few public bad same able free sure clear full special easy
strong certain late hard real best better quiet bright dark heavy light warm cold simple
careful curious patient ancient modern tiny huge narrow wide gentle sudden steady rapid
silent hidden golden broken empty crowded distant familiar"""
)
ADVS = _words(
    """
quickly slowly carefully quietly suddenly often rarely always never usually finally
nearly simply clearly gently easily almost together again already soon later"""
)
NAMES = _words(
    """
Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Liam Maria Noah Olivia
Peter Quinn Rosa Samuel Tara Umar Vera Walter Xenia Yusuf Zoe"""
)
PLACES = _words(
    """
London Paris Tokyo Cairo Lima Oslo Rome Berlin Madrid Dublin Vienna Prague Nairobi
Sydney Toronto Chicago Boston Denver Seattle Lisbon"""
)
PREPS = _words("in on under near behind across through beside over after before during without")
CONJ = ["and", "but", "so", "because", "while", "although", "when", "until", "since"]
TOPICS = ["science", "music", "history", "cooking", "travel", "weather", "mathematics", "code"]


def _np(r: random.Random) -> str:
    det = r.choice(["the", "a", "this", "that", "every", "each", "one", "her", "his", "our"])
    adj = f"{r.choice(ADJS)} " if r.random() < 0.5 else ""
    noun = r.choice(NOUNS)
    if det == "a" and (adj or noun)[0] in "aeiou":
        det = "an"
    return f"{det} {adj}{noun}"


def _clause(r: random.Random) -> str:
    subj = r.choice([r.choice(NAMES), _np(r), r.choice(["she", "he", "they", "we", "I", "you"])])
    verb = r.choice(VERBS)
    tense = r.random()
    if tense < 0.35:
        verb = verb + ("d" if verb.endswith("e") else "ed")
    elif tense < 0.5:
        verb = f"will {verb}"
    elif tense < 0.6:
        verb = f"could {verb}"
    out = f"{subj} {verb} {_np(r)}"
    if r.random() < 0.4:
        out += f" {r.choice(PREPS)} {_np(r)}"
    if r.random() < 0.2:
        out += f" {r.choice(ADVS)}"
    if r.random() < 0.15:
        out += f" {r.choice(PREPS)} {r.choice(PLACES)}"
    return out


def _sentence(r: random.Random) -> str:
    s = _clause(r)
    if r.random() < 0.35:
        s += f", {r.choice(CONJ)} {_clause(r)}"
    s = s[0].upper() + s[1:]
    return s + r.choice([".", ".", ".", "!", "?"]) if not s.endswith("?") else s


def _extra(r: random.Random) -> str:
    """Numbers, lists, dialogue, code and tool-call shaped lines, for realistic byte coverage."""
    kind = r.randrange(5)
    if kind == 0:
        n = r.randint(2, 9999)
        return f"In {r.randint(1800, 2030)}, {r.choice(NAMES)} counted {n} {r.choice(NOUNS)}s."
    if kind == 1:
        items = "\n".join(f"{i + 1}. {_sentence(r)}" for i in range(r.randint(2, 4)))
        return f"Notes about {r.choice(TOPICS)}:\n{items}"
    if kind == 2:
        return f'"{_sentence(r)}" said {r.choice(NAMES)}. "{_sentence(r)}"'
    if kind == 3:
        a, b = r.choice(NOUNS), r.choice(NOUNS)
        return f"def {a}_{b}(x):\n    return x * {r.randint(2, 99)} + len({a!r})"
    args = json.dumps({"city": r.choice(PLACES), "days": r.randint(1, 7)})
    return f"<tool_call>\n<function=get_{r.choice(NOUNS)}>\n{args}\n</function>\n</tool_call>"


def write_corpus(path: Path, target_bytes: int = 400_000, seed: int = 0) -> None:
    r = random.Random(seed)
    paras: list[str] = []
    size = 0
    while size < target_bytes:
        para = " ".join(_sentence(r) for _ in range(r.randint(2, 7)))
        if r.random() < 0.3:
            para += "\n" + _extra(r)
        paras.append(para)
        size += len(para) + 2
    path.write_text("\n\n".join(paras) + "\n", encoding="utf-8")


def train(corpus: Path, vocab: int) -> None:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(ASSETS / "tokenizer"),
        model_type="bpe",
        vocab_size=vocab,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        allow_whitespace_only_pieces=True,
        user_defined_symbols=SPECIALS,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        num_threads=2,
        minloglevel=2,
    )
    (ASSETS / "tokenizer.vocab").unlink()


def write_configs() -> None:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(ASSETS / "tokenizer.model"))
    ids = {t: sp.piece_to_id(t) for t in SPECIALS}
    tok_config = {
        "tokenizer_class": "ninfer-demo-sentencepiece",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "added_tokens_decoder": {
            str(i): {"content": t, "special": t in CONTROL} for t, i in ids.items()
        },
        "model_max_length": 32768,
        "chat_template": TEMPLATE.read_text(encoding="utf-8"),
    }
    vocab = -(-sp.get_piece_size() // 64) * 64
    config = {
        "_comment": "ninfer demo model: random weights, its text is noise",
        "model_type": "qwen3_5_text",
        "vocab_size": vocab,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 8,
        "full_attention_interval": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    }
    for name, obj in (("tokenizer_config.json", tok_config), ("config.json", config)):
        (ASSETS / name).write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=2560)
    ap.add_argument("--regen-corpus", action="store_true")
    args = ap.parse_args()
    ASSETS.mkdir(parents=True, exist_ok=True)
    corpus = ASSETS / "corpus.txt"
    if args.regen_corpus or not corpus.exists():
        write_corpus(corpus)
    train(corpus, args.vocab)
    write_configs()
    total = sum(p.stat().st_size for p in ASSETS.iterdir())
    print(f"wrote {ASSETS} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
