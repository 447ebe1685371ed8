"""Write two inspect_ai logs of the arith task, offline, for ``posttrain eval --compare``.

Two scripted "checkpoints" stand in for two models (inspect's mockllm provider, answering
with a function): ``before`` gets every product wrong and half of the sums, ``after``
gets the sums right and one product in four wrong; each draws its mistakes at random, so
the three epochs of a log differ the way repeated samples of one model do. inspect
computes the scores; posttrain only reads the logs.

    python examples/inspect_arith/scripted_logs.py logs/    # logs/before.eval, logs/after.eval
    posttrain eval --compare logs/before.eval logs/after.eval
"""

from __future__ import annotations

import random
import re
import shutil
import sys
from pathlib import Path

from inspect_ai import eval as inspect_eval
from inspect_ai.model import ModelOutput, ModelUsage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inspect_arith import arith  # the task next to this file

# the share of questions each checkpoint gets wrong, by operation
CHECKPOINTS = {"before": {"plus": 0.5, "times": 1.0}, "after": {"plus": 0.0, "times": 0.25}}


def scripted(wrong: dict[str, float], seed: int):
    """A mockllm answer function: the right number, or one too high with the given odds."""
    rng = random.Random(seed)

    def answer(input, tools, tool_choice, config) -> ModelOutput:
        a, op, b = re.search(r"(\d+) (plus|times) (\d+)", input[-1].text).groups()
        value = int(a) + int(b) if op == "plus" else int(a) * int(b)
        if rng.random() < wrong[op]:
            value += 1
        output = ModelOutput.from_content(model="mockllm", content=str(value))
        # token counts given, so inspect does not count them with tiktoken (a download)
        output.usage = ModelUsage(input_tokens=20, output_tokens=2, total_tokens=22)
        return output

    return answer


def main(folder: str) -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for seed, (name, wrong) in enumerate(CHECKPOINTS.items()):
        log = inspect_eval(arith(count=60), model="mockllm/model", epochs=3, display="none",
                           model_args={"custom_outputs": scripted(wrong, seed)},
                           log_dir=str(out / f".{name}"))[0]
        shutil.move(log.location, out / f"{name}.eval")
        shutil.rmtree(out / f".{name}")
        metrics = [f"{score.name} {metric.name} {metric.value:.2f}"
                   for score in log.results.scores for metric in score.metrics.values()]
        print(f"{out / f'{name}.eval'}: {log.status}, {', '.join(metrics)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "logs")
