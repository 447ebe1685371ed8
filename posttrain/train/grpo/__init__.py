"""The GRPO recipe: its settings (``settings``), the trainer and ``run_grpo`` (``trainer``),
and what only GRPO uses: rollouts through posttrain's sampler, the shared prompt prefix in
the update, the step's phase timings, and the watch over a run (no-signal groups, the
reward-hacking monitor and its alarm rules)."""
