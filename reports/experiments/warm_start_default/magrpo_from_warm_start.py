"""MAGRPO from a saved warm-started pair with another learning rate (the probe of this experiment's lr arm).

usage: python magrpo_from_warm_start.py WARM_START_ADAPTERS LR OUT SEED   (run at the root of a repository clone)

Builds the train_magrpo stage's model and trainer from ./params.yaml (LoRA adapters initialised as the stage does
for ``train_magrpo.seed = SEED``), copies the warm-started adapters (``models/adapters/magrpo/warm_start/{helper,
main}``, saved by the stage) into them, and runs the stage's 24 MAGRPO updates with ``learning_rate = LR`` and
no warm start of its own. Writes OUT/adapters (for ``orchestry evaluate --adapters``), OUT/steps.jsonl and
OUT/samples.jsonl. Not the pipeline: the sampling generator starts where the stage's would start without a warm
start, so the rollouts differ from the stage's at the same seed (the comparison is paired over test problems,
not over rollouts).
"""

import json
import sys
import time
from pathlib import Path

from peft import set_peft_model_state_dict
from safetensors.torch import load_file

from orchestry.params_file import load_params
from orchestry.problems import read_problems
from orchestry.runtime import build_policy, open_sandbox
from orchestry.training.magrpo.trainer import MAGRPOTrainer


def main() -> None:
    warm, lr, out, seed = Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    params = load_params("params.yaml")
    cfg = params.train_magrpo.model_copy(update={"warm_start_epochs": 0, "learning_rate": lr, "seed": seed})
    model, tok = build_policy(params, ("helper", "main"), cfg)
    for agent in ("helper", "main"):
        state = load_file(str(warm / agent / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(model, state, adapter_name=agent)
        if result.unexpected_keys:
            raise SystemExit(f"{warm / agent}: keys that fit no LoRA weight: {result.unexpected_keys[:3]}")
    for name, p in model.named_parameters():
        p.requires_grad = "lora_" in name
    problems = read_problems("data/problems/train.jsonl")[: cfg.max_problems]
    out.mkdir(parents=True, exist_ok=True)
    with open_sandbox(params) as sandbox:
        trainer = MAGRPOTrainer(model, tok, problems, sandbox, cfg, params.sampling, out / "ckpt")
        t0 = time.time()
        history = trainer.train(progress=False)
        print(f"{len(history)} updates in {time.time() - t0:.0f} s")
        trainer.save_adapters(out / "adapters")
    (out / "steps.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    (out / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in trainer.samples))


if __name__ == "__main__":
    main()
