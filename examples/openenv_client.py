"""Drive a posttrain rule served by `posttrain env serve` with OpenEnv's own client: what
TRL's OpenEnv integration or any OpenEnv trainer does. The replies here come from the refund
rule's seeded scripted agent; a trainer's would come from its policy.

    posttrain env serve --env refund --port 8010 &
    python examples/openenv_client.py http://127.0.0.1:8010
"""

from __future__ import annotations

import sys

from openenv import GenericEnvClient

from posttrain.envs import get_env

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8010"
agent = get_env("refund").scripted_agent(seed=0)
with GenericEnvClient(base_url=url).sync() as env:
    for seed in range(6):
        first = env.reset(seed=seed)  # prompt `seed` of the served set
        reply = agent(first.observation["messages"])  # the chat the policy answers
        result = env.step({"reply": reply})  # graded by the rule, one step, done
        print(f"seed {seed} ({first.metadata['category']}): {first.observation['prompt']!r}\n"
              f"  reply {reply[:70]!r}\n  reward {result.reward}, done {result.done}, "
              f"passed {result.metadata['passed']}")
