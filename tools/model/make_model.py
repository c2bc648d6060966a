"""Writes the small model the tests and the demo serve with llama.cpp.

servemesh's tests need a real model server that loads in a second on two
cores and needs nothing downloaded at run time. This writes one: a
llama-architecture GGUF with random weights (seeded, so every run writes
the same bytes) over a byte-level BPE vocabulary, and the same tokenizer
as a Hugging Face tokenizer.json beside it, so a benchmark tool can count
tokens as the engine does. Its answers are gibberish; what matters to the
mesh is what a real engine does with a prompt: tokenize it, evaluate it
(a long prompt's prefill costs more than a cached one), stream tokens and
report usage.

    python make_model.py OUT_DIR
"""

import json
import os
import sys

import gguf
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

# Small enough for two cores, large enough that a 2,000-token prefill
# clearly costs more than a cached one.
N_EMBD, N_LAYER, N_HEAD, N_FF, N_CTX = 128, 4, 4, 384, 8192
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# One merge, of the bytes 0x80 and 0x81 (llama.cpp refuses a BPE
# vocabulary without merges): ASCII text never meets it, so a prompt of
# ASCII tokens decodes and encodes back to the same tokens, as a tool
# that writes prompts of an exact length (inference-perf) needs.
MERGES = [("Ģ", "ģ")]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokens():
    """The 256 byte-level tokens, as GPT-2's byte-to-unicode map spells them."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def write_tokenizer(out, tokens):
    """tokenizer.json, and the tokenizer_config.json a benchmark tool
    (transformers' AutoTokenizer) loads it by. The tokens of bytes 0x80
    and up are marked special there, as the chat tokens are: a tool that
    writes prompts of random tokens (inference-perf) leaves them out, so
    its prompts are ASCII, which decodes and encodes back to the same
    tokens as the engine counts them (a lone byte 0x80 and up decodes to
    U+FFFD, three tokens). Prompts of ASCII text tokenize as the engine's
    vocabulary does; the GGUF keeps them normal."""
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    high = byte_tokens()[0x80:]
    tok.add_special_tokens(high + SPECIAL)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": N_CTX, "eos_token": "<|im_end|>",
                   "bos_token": "<|endoftext|>", "clean_up_tokenization_spaces": False}, f)


def write_gguf(path, tokens):
    rng = np.random.default_rng(59)
    n_vocab = len(tokens)

    def weights(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = gguf.GGUFWriter(path, "llama")
    w.add_name("servemesh-tiny")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (n_vocab - len(SPECIAL)) + [gguf.TokenType.CONTROL] * len(SPECIAL))
    w.add_token_merges([f"{a} {b}" for a, b in MERGES])
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    w.add_tensor("token_embd.weight", weights(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", weights(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weights(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weights(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weights(N_EMBD, N_FF))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", weights(n_vocab, N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_model.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tokens = byte_tokens() + ["".join(m) for m in MERGES] + SPECIAL
    write_tokenizer(out, tokens)
    tmp = os.path.join(out, "tiny.gguf.tmp")
    write_gguf(tmp, tokens)
    os.replace(tmp, os.path.join(out, "tiny.gguf"))
    with open(os.path.join(out, "model.json"), "w") as f:
        json.dump({"model": "tiny.gguf", "tokenizer": "tokenizer.json", "n_ctx": N_CTX, "n_vocab": len(tokens)}, f)


if __name__ == "__main__":
    main()
