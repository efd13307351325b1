"""A Hugging Face MoE model with its MoE blocks replaced by epmoe: greedy tokens before and after.

Builds a small, randomly initialized transformers model with MoE layers (Qwen3-MoE or Mixtral from
a tiny config), generates N tokens greedily with the original model, replaces every MoE block by
``epmoe.torch.from_hf(block)`` (one rank on the model's device: the CPU reference runner on
``--device cpu``, runner "cuda" on ``--device cuda``), generates again from the same prompts and
compares the tokens. Exit code 0 when every token matches, 1 otherwise.

What "match" can mean: transformers' blocks compute in bf16 (bf16 GEMM outputs, bf16 SwiGLU, a bf16
sum over k) while epmoe accumulates in fp32 and rounds once per stage (docs/DESIGN.md §4), so the
MoE outputs differ by about 1% of their magnitude. Greedy decoding amplifies that only where two
logits are nearly tied; then the sequences part and stay apart. The script therefore also runs a
teacher-forced pass over the original sequence with both models and prints how far the logits are
apart and whether each position's argmax agrees, which says whether a divergence is such a near tie.

    python3 examples/python/hf_moe.py                     # cuda when available, else the CPU
    python3 examples/python/hf_moe.py --device cpu --model mixtral --new-tokens 64

Needs torch and transformers (pip install 'epmoe[hf]' or the two packages by hand).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

import epmoe
import epmoe.torch as et


def parse_args(argv=None) -> argparse.Namespace:
    cuda_ok = torch.cuda.is_available() and epmoe.with_cuda
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=["qwen3", "mixtral"], default="qwen3", help="transformers model family")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if cuda_ok else "cpu",
                   help="where the model and epmoe run (cpu: epmoe's reference runner)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (each with an MoE block)")
    p.add_argument("--hidden", type=int, default=256, help="hidden size H")
    p.add_argument("--intermediate", type=int, default=128, help="intermediate size I of one expert")
    p.add_argument("--experts", type=int, default=8, help="routed experts E")
    p.add_argument("--top-k", type=int, default=2, help="experts per token K")
    p.add_argument("--vocab", type=int, default=512, help="vocabulary size")
    p.add_argument("--batch", type=int, default=2, help="prompts generated together")
    p.add_argument("--prompt-len", type=int, default=16, help="tokens per prompt")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per prompt (greedy)")
    p.add_argument("--init-std", type=float, default=0.05,
                   help="std of the random weights (larger = peakier logits, fewer near ties)")
    p.add_argument("--weight-format", choices=["bf16", "fp8", "nvfp4"], default="bf16",
                   help="epmoe's expert weight format (fp8/nvfp4 quantize the model's weights: tokens "
                        "are then expected to differ)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.device == "cuda" and not cuda_ok:
        p.error("--device cuda: no CUDA device, or epmoe was built without CUDA (use --device cpu)")
    return args


def build_model(args) -> torch.nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4,
                  num_experts_per_tok=args.top_k, initializer_range=args.init_std,
                  max_position_embeddings=4 * (args.prompt_len + args.new_tokens))
    if args.model == "qwen3":
        cfg = Qwen3MoeConfig(moe_intermediate_size=args.intermediate, intermediate_size=4 * args.intermediate,
                             num_experts=args.experts, norm_topk_prob=True, decoder_sparse_step=1,
                             mlp_only_layers=[], **common)
        cls = Qwen3MoeForCausalLM
    else:
        cfg = MixtralConfig(intermediate_size=args.intermediate, num_local_experts=args.experts, **common)
        cls = MixtralForCausalLM
    torch.manual_seed(args.seed)
    model = cls(cfg)  # transformers initializes every weight with N(0, initializer_range)
    return model.to(device=args.device, dtype=torch.bfloat16).eval()


def moe_blocks(model: torch.nn.Module):
    """(parent, attribute name, block) for every MoE block: modules with a router (gate) and experts."""
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if hasattr(child, "gate") and hasattr(child, "experts") and "Moe" in type(child).__name__:
                found.append((parent, name, child))
    return found


def generate(model, prompts: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy: exactly n new tokens per prompt (no early stop at an end-of-sequence token)."""
    from transformers import GenerationConfig

    gen = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                           pad_token_id=0, use_cache=True)
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_config=gen)
    return out[:, prompts.shape[1]:]


def logits_of(model, seq: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(seq).logits.float()


def main(argv=None) -> int:
    args = parse_args(argv)
    model = build_model(args)
    blocks = moe_blocks(model)
    if not blocks:
        print("no MoE blocks found in the model", file=sys.stderr)
        return 1
    g = torch.Generator().manual_seed(args.seed + 1)
    prompts = torch.randint(1, args.vocab, (args.batch, args.prompt_len), generator=g).to(args.device)

    t0 = time.perf_counter()
    ref = generate(model, prompts, args.new_tokens)
    t_ref = time.perf_counter() - t0
    full = torch.cat([prompts, ref], dim=1)
    ref_logits = logits_of(model, full)

    # Every MoE block becomes an epmoe module; the capacity bounds the tokens of one call (the
    # teacher-forced pass below sends the whole batch at once).
    capacity = args.batch * (args.prompt_len + args.new_tokens)
    for parent, name, block in blocks:
        setattr(parent, name, et.from_hf(block, capacity=capacity, weight_format=args.weight_format))
    cfg = getattr(parent, name).experts.config
    print(f"{args.model}: {len(blocks)} MoE blocks replaced on {args.device} (dispatcher {cfg.dispatcher}, "
          f"runner {cfg.runner}, weights {args.weight_format}, router {cfg.router.kind.name}, "
          f"E={cfg.num_experts} K={cfg.top_k} H={cfg.hidden} I={cfg.intermediate})")

    t0 = time.perf_counter()
    got = generate(model, prompts, args.new_tokens)
    t_got = time.perf_counter() - t0
    got_logits = logits_of(model, full)

    differ = (got != ref)
    n_diff = int(differ.sum())
    for b in range(args.batch):
        print(f"prompt {b}: original {ref[b].tolist()}")
        print(f"prompt {b}: epmoe    {got[b].tolist()}")
        if differ[b].any():
            first = int(differ[b].nonzero()[0])
            pos = args.prompt_len + first - 1  # the logits that chose new token `first`
            top2 = ref_logits[b, pos].topk(2).values
            print(f"prompt {b}: first difference at new token {first}; the original's top-2 logits there "
                  f"were {top2[0]:.4f} and {top2[1]:.4f} (margin {top2[0] - top2[1]:.4f})")

    # Teacher-forced: both models on the original sequence, position by position.
    scale = ref_logits.abs().max().item()
    rel = (got_logits - ref_logits).abs().max().item() / max(scale, 1e-30)
    agree = (got_logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
    print(f"teacher-forced logits: max|diff|/max|ref| {rel:.3g}, argmax agreement {100 * agree:.2f}% "
          f"of {ref_logits.shape[0] * ref_logits.shape[1]} positions")
    print(f"generation: original {t_ref:.2f} s, epmoe {t_got:.2f} s")
    total = ref.numel()
    if n_diff == 0:
        print(f"tokens: all {total} match")
        return 0
    print(f"tokens: {n_diff} of {total} differ")
    return 1


if __name__ == "__main__":
    sys.exit(main())
