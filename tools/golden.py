#!/usr/bin/env python3
"""golden.py - the transformers oracle for tests/test-model.cpp.

Runs on the GPU machine (torch + transformers, no network; see tools/device-golden.sh). Loads a
synthetic checkpoint written by gptoss-synth with transformers' GptOssForCausalLM (bf16 load,
MXFP4 experts dequantized, then .float(): every bf16 and MXFP4 value is exact in fp32; eager
attention, on the CPU, so the reference adds no rounding of its own) and writes one JSON file:
for fixed prompts of token ids, logits at chosen positions (a fixed subset of vocab ids plus
the top 32, and max|logit| over the whole vocabulary) and 32-token greedy continuations with the
top-2 logit gap at each step. It also checks that the oracle is sane (finite, not constant)
and that transformers' dequantized experts equal MODEL.md's MXFP4 definition, and records
versions, the checkpoint's sha256 and the command.
"""
import argparse
import hashlib
import json
import math
import os
import struct
import sys


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return state, z ^ (z >> 31)


def random_tokens(seed, n, upper=199998):
    """n token ids in [0, upper) from splitmix64(seed): ordinary tokens, no specials."""
    state, out = seed, []
    for _ in range(n):
        state, r = splitmix64(state)
        out.append(r % upper)
    return out


# name, PRNG seed, length, positions whose logits are recorded. The 320-token prompt makes
# sliding layers (window 128) see truncated windows; 127/128/129 straddle the window edge.
PROMPTS = [
    ("short", 11, 24, [0, 1, 7, 23]),
    ("medium", 22, 130, [0, 64, 126, 127, 128, 129]),
    ("long", 33, 320, [0, 100, 127, 128, 129, 200, 255, 256, 300, 319]),
]
VOCAB_STRIDE = 256     # every 256th vocab id is recorded at each position...
TOP_N = 32             # ...plus the top 32
GREEDY_STEPS = 32


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return header, 8 + n


def mxfp4_dequant_reference(torch, blocks, scales):
    """MODEL.md's definition: low nibble = even element, value e2m1 * 2^(scale-127).
    blocks u8 [E, N, K/32, 16], scales u8 [E, N, K/32] -> fp32 [E, N, K]."""
    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    lo = lut[(blocks & 15).long()]
    hi = lut[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], 32)
    scale = torch.pow(2.0, scales.float() - 127.0).unsqueeze(-1)
    return (vals * scale).reshape(blocks.shape[0], blocks.shape[1], -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, help="golden JSON file to write")
    ap.add_argument("--params-out", help="text file listing transformers' parameters")
    ap.add_argument("--synth-command", default="gptoss-synth --preset tiny --seed 1")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import GptOssForCausalLM

    torch.manual_seed(0)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, python {sys.version.split()[0]}")

    files = sorted(f for f in os.listdir(args.model) if f.endswith(".safetensors"))
    sha = {f: sha256_file(os.path.join(args.model, f)) for f in files}
    for f, h in sha.items():
        print(f"sha256 {h}  {f}")

    # Load: bf16 with MXFP4 experts dequantized (DEVICE.md), then fp32, eager attention, CPU.
    load_note = ""
    try:
        from transformers import Mxfp4Config
        model, info = GptOssForCausalLM.from_pretrained(
            args.model, dtype=torch.bfloat16, quantization_config=Mxfp4Config(dequantize=True),
            attn_implementation="eager", output_loading_info=True)
        load_note = "from_pretrained(dtype=bfloat16, quantization_config=Mxfp4Config(dequantize=True), attn_implementation=eager)"
    except Exception as e:  # report and try the plain call
        print(f"load with Mxfp4Config(dequantize=True) failed: {e!r}; retrying without it")
        model, info = GptOssForCausalLM.from_pretrained(
            args.model, dtype=torch.bfloat16, attn_implementation="eager", output_loading_info=True)
        load_note = "from_pretrained(dtype=bfloat16, attn_implementation=eager)"
    print("load:", load_note)
    print("loading info:", {k: sorted(v) if isinstance(v, (set, list)) else v for k, v in info.items()})
    model = model.float().cpu().eval()
    print("config class:", type(model.config).__name__, "attn:", model.config._attn_implementation)

    # Parameters transformers holds after loading (names, dtypes, shapes).
    lines = [f"# transformers {transformers.__version__}, torch {torch.__version__}: {load_note}",
             f"# loading info: {json.dumps({k: sorted(map(str, v)) if isinstance(v, (set, list)) else str(v) for k, v in info.items()})}"]
    for name, p in model.state_dict().items():
        lines.append(f"{name}\t{str(p.dtype).replace('torch.', '')}\t{list(p.shape)}")
    # And what the checkpoint holds (what the loader checks).
    for f in files:
        header, _ = read_safetensors(os.path.join(args.model, f))
        for name in sorted(header):
            if name != "__metadata__":
                lines.append(f"checkpoint {f}\t{name}\t{header[name]['dtype']}\t{header[name]['shape']}")
    if args.params_out:
        with open(args.params_out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    print("\n".join(lines[:40]))

    checks = {}
    vocab = model.config.vocab_size
    # MXFP4: transformers' dequantized experts against MODEL.md's definition, from the raw file.
    try:
        from safetensors.torch import load_file
        raw = {}
        for f in files:
            raw.update(load_file(os.path.join(args.model, f)))
        experts = model.model.layers[0].mlp.experts
        sd = {k: v for k, v in experts.state_dict().items()}
        print("layer 0 experts params:", {k: list(v.shape) for k, v in sd.items()})
        for proj in ("gate_up_proj", "down_proj"):
            ref = mxfp4_dequant_reference(torch, raw[f"model.layers.0.mlp.experts.{proj}_blocks"],
                                          raw[f"model.layers.0.mlp.experts.{proj}_scales"])  # [E, N, K]
            got = sd[proj].float()
            # Check both orientations: in the tiny preset H == I, so the shape alone cannot tell.
            same, layout = False, f"unexpected shape {list(got.shape)} vs ref {list(ref.shape)}"
            if got.shape == ref.transpose(1, 2).shape and torch.equal(got, ref.transpose(1, 2)):
                same, layout = True, "[E, K, N] (in, out)"
            elif got.shape == ref.shape and torch.equal(got, ref):
                same, layout = True, "[E, N, K] (out, in)"
            checks[f"mxfp4_{proj}_matches_model_md"] = bool(same)
            print(f"MXFP4 {proj}: transformers holds {layout}; equal to MODEL.md dequant: {same}")
    except Exception as e:
        print(f"MXFP4 layout check could not run: {e!r}")
        checks["mxfp4_check_error"] = repr(e)

    stride_ids = list(range(0, vocab, VOCAB_STRIDE))

    def logits_of(tokens):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([tokens], dtype=torch.long), use_cache=False)
        return out.logits[0].float()

    prompts = []
    all_finite, all_varied = True, True
    for name, seed, length, positions in PROMPTS:
        tokens = random_tokens(seed, length, upper=min(199998, vocab))
        logits = logits_of(tokens)  # [T, V]
        all_finite &= bool(torch.isfinite(logits).all())
        recs = []
        for pos in positions:
            row = logits[pos]
            all_varied &= bool(row.std() > 0)
            top = torch.topk(row, TOP_N)  # ties: torch order; ids recorded explicitly
            top_ids = top.indices.tolist()
            ids = sorted(set(stride_ids) | set(top_ids))
            recs.append({
                "pos": pos,
                "max_abs": float(row.abs().max()),
                "argmax": int(torch.argmax(row)),
                "top_ids": top_ids,
                "ids": ids,
                "logits": [float(row[i]) for i in ids],
            })
            print(f"{name} pos {pos}: max|logit| {recs[-1]['max_abs']:.6f} argmax {recs[-1]['argmax']} "
                  f"std {float(row.std()):.6f}")
        # Greedy continuation by full recomputation at every step (no cache implementation involved).
        seq, greedy, gaps, maxabs = list(tokens), [], [], []
        row = logits[-1]
        for step in range(GREEDY_STEPS):
            top2 = torch.topk(row, 2)
            tok = int(torch.argmax(row))
            greedy.append(tok)
            gaps.append(float(top2.values[0] - top2.values[1]))
            maxabs.append(float(row.abs().max()))
            seq.append(tok)
            if step + 1 < GREEDY_STEPS:
                row = logits_of(seq)[-1]
                all_finite &= bool(torch.isfinite(row).all())
        print(f"{name} greedy: {greedy}\n  min gap {min(gaps):.3e}, gaps {[f'{g:.2e}' for g in gaps]}")
        prompts.append({"name": name, "seed": seed, "tokens": tokens, "positions": recs,
                        "greedy": {"tokens": greedy, "top2_gap": gaps, "max_abs": maxabs}})

    # Sanity of the oracle itself: finite, not constant, and not the same at every position.
    p = prompts[2]["positions"]
    differs = p[0]["logits"] != p[-1]["logits"]
    checks.update({"finite": all_finite, "not_constant": all_varied, "positions_differ": differs})
    print("oracle checks:", checks)
    ok = all_finite and all_varied and differs

    doc = {
        "what": "transformers GptOssForCausalLM logits and greedy continuations on a gptoss-synth checkpoint",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load": load_note + "; then .float() on the CPU, use_cache=False",
        "checkpoint": args.synth_command,
        "sha256": sha,
        "command": "python3 tools/golden.py " + " ".join(sys.argv[1:]),
        "vocab_stride": VOCAB_STRIDE,
        "top_n": TOP_N,
        "checks": checks,
        "prompts": prompts,
    }
    with open(args.out, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
        fh.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes); oracle sane: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
