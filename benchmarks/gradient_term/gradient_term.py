"""How large is the gradient term of the paper's Eq. 5 that backpropagating the PACS loss does not produce?

    python -m benchmarks.gradient_term.gradient_term --work-dir /tmp/pacs-bench-anchor  # after anchor.py's SFT
    python -m benchmarks.gradient_term.gradient_term --smoke

The paper differentiates L(theta) = E_{q, o ~ pi_theta}[l(psi(o), R(o))] and so gets (Eq. 5, Appendix A.1)

    grad L = E[ grad_theta l(psi, R) ]  +  E[ l(psi, R) * grad_theta log pi_theta(o | q) ],

the second term coming from the sampling distribution's dependence on theta (a score-function term with the BCE as
its "reward"). The authors' code and `pacs` backpropagate the BCE of sampled completions, which gives the first term
only. On the learning benchmark's task (learning.py) this script trains PACS with the reference anchor for a few
steps, and at several points samples groups from the current policy and computes both terms on them (the same
normalisation and class weights as the loss; no baseline in the second term, as in Eq. 5): their norms, their ratio
and their cosine. Writes gradient_term.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from torch.nn.utils import parameters_to_vector

from benchmarks import _tasks, harness, rl_runs


HERE = Path(__file__).resolve().parent


def completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    T = completion_ids.size(1)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -T - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)


def both_terms(policy, reference, tokenizer, problems, G: int, beta: float, seed: int) -> dict:
    """The implemented gradient and Eq. 5's extra term on G fresh samples for each problem."""
    from pacs.loss import pacs_loss

    torch.manual_seed(seed)
    prompts = [p for p, _ in problems]
    enc = tokenizer([p for p in prompts for _ in range(G)], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = policy.generate(
            **enc, do_sample=True, temperature=1.0, max_new_tokens=_tasks.COMPLETION_TOKENS,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
    completion_ids = out[:, enc.input_ids.size(1) :]
    is_eos = completion_ids == tokenizer.eos_token_id
    first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full((len(out),), completion_ids.size(1)))
    completion_mask = (torch.arange(completion_ids.size(1))[None] <= first_eos[:, None]).long()
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    answers = [_tasks.final_answer(a) for _, a in problems for _ in range(G)]
    labels = torch.tensor(_tasks.answer_reward(texts, answers))
    args = (enc.input_ids, enc.attention_mask, completion_ids, completion_mask)
    with torch.no_grad():
        ref = completion_logps(reference, *args)
    params = [p for p in policy.parameters() if p.requires_grad]
    logps = completion_logps(policy, *args)
    loss, stats = pacs_loss(logps, ref, completion_mask, labels, G, beta=beta)
    implemented = torch.autograd.grad(loss, params, retain_graph=True)
    # per-completion loss terms l_i (weighted and normalised as in the loss: loss = sum_i l_i)
    per_row = (
        stats["weights"]
        * torch.nn.functional.binary_cross_entropy_with_logits(stats["psi"], labels, reduction="none")
        / len(labels)
    )
    seq_logp = (logps * completion_mask).sum(1)  # (B,) log pi_theta(o_i | q)
    extra = torch.autograd.grad((per_row.detach() * seq_logp).sum(), params)
    g1, g2 = parameters_to_vector(implemented), parameters_to_vector(extra)
    return {
        "label_mean": labels.mean().item(),
        "psi_abs_mean": stats["psi"].abs().mean().item(),
        "implemented_norm": g1.norm().item(),
        "extra_norm": g2.norm().item(),
        "ratio": (g2.norm() / g1.norm()).item() if g1.norm() > 0 else float("nan"),  # no mixed group: g1 = 0
        "cosine": torch.nn.functional.cosine_similarity(g1, g2, dim=0).item(),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work-dir", default="/tmp/pacs-bench-anchor", help="holds sft/ (learning.py's warm start)")
    p.add_argument("--out-dir", default=str(HERE))
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--steps", type=int, nargs="+", default=[0, 20, 40, 80, 120], help="measure after these steps")
    p.add_argument("--problems", type=int, default=16)
    p.add_argument("--repeats", type=int, default=4, help="fresh samples per measurement point")
    p.add_argument("--smoke", action="store_true")
    args, rest = p.parse_known_args(argv)
    largs = rl_runs.parse_args(rest + (["--smoke"] if args.smoke else []) + ["--work-dir", args.work_dir])
    if args.smoke:
        args.steps, args.problems, args.repeats = [0, 2], 2, 1
    torch.set_num_threads(1)
    info = harness.machine_info()  # the CPU (model, kernels, lscpu flags hash), versions and code, as every study
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    tokenizer = _tasks.build_char_tokenizer()
    test, val, dev, sft, rl = _tasks.make_problems()
    sft_path, warm = _tasks.warm_start(largs, _tasks.task(largs))  # pinned (benchmarks/warm_starts/), sha256 checked
    reference = AutoModelForCausalLM.from_pretrained(sft_path).eval()
    rl_runs.CONFIGS["PACS reference"] = (
        "pacs",
        {"pacs_beta": 1.0, "pacs_class_weight": "balanced", "pacs_anchor": "reference"},
    )
    largs.max_steps = max(args.steps)
    dataset = Dataset.from_dict({"prompt": [q for q, _ in rl], "answer": [_tasks.final_answer(a) for _, a in rl]})
    out = os.path.join(args.work_dir, "gradient_term")
    trainer = rl_runs.make_trainer("PACS reference", args.lr, largs, sft_path, dataset, 0, out)
    points = []

    def measure(model, step):
        policy = AutoModelForCausalLM.from_pretrained(sft_path)  # a plain copy (no TRL forward patch)
        policy.load_state_dict(model.state_dict())
        policy.eval()
        for r in range(args.repeats):
            problems = val[r * args.problems : (r + 1) * args.problems]
            points.append({"step": step, "repeat": r, **both_terms(policy, reference, tokenizer, problems, 8, 1.0, r)})
            print(f"[gradient_term] step {step} repeat {r}: {points[-1]}", flush=True)

    class Measure(TrainerCallback):
        def on_train_begin(self, a, state, control, model=None, **kw):
            if 0 in args.steps:
                measure(model, 0)

        def on_step_end(self, a, state, control, model=None, **kw):
            if state.global_step in args.steps:
                measure(model, state.global_step)

    trainer.add_callback(Measure())
    trainer.train()
    rows = [
        "| after optimizer step | samples | label mean | mean abs(ψ) | ‖extra‖ / ‖implemented‖ (min / median / max) | cosine (median) |",
        "|---|---|---|---|---|---|",
    ]
    for step in args.steps:
        ps = [x for x in points if x["step"] == step]
        ratios = sorted(x["ratio"] for x in ps)
        cos = sorted(x["cosine"] for x in ps)
        rows.append(
            f"| {step} | {len(ps)} x {args.problems * 8} | {sum(x['label_mean'] for x in ps) / len(ps):.3f} | "
            f"{sum(x['psi_abs_mean'] for x in ps) / len(ps):.3f} | {ratios[0]:.2f} / {ratios[len(ratios) // 2]:.2f} / "
            f"{ratios[-1]:.2f} | {cos[len(cos) // 2]:+.3f} |"
        )
    table = "\n".join(rows)
    print(table)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = "gradient_term_smoke.json" if args.smoke else "gradient_term.json"
    info["load_average_end"] = harness.load_average()
    argv_ = sys.argv if argv is None else ["benchmarks/gradient_term/gradient_term.py", *argv]
    raw = {"info": info, "args": vars(args), "argv": argv_, "warm_start": warm, "points": points, "table": table}
    (out / name).write_text(json.dumps(raw, indent=1))
    return raw


if __name__ == "__main__":
    main()
