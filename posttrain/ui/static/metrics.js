// The curves a page shows by default, when a run has the metric, in this order.
// Shared by the run page and the compare page. Entries: [metric, title, help].

export const DEFAULT_CHARTS = [
  ["reward", "reward", "mean rule score of the step's training completions"],
  ["reward_std", "reward std", "spread within each prompt's group; 0 leaves nothing to learn"],
  ["frac_reward_zero_std", "groups with no signal",
    "share of groups whose completions all scored the same: zero advantage, nothing learned"],
  ["kl", "KL to the reference", "how far the policy moved from the base (adapter off)"],
  ["completion_length", "completion length (tokens)", "mean tokens per training completion"],
  ["loss", "loss", "the trainer's loss"],
  ["token_accuracy", "reply token accuracy (SFT)",
    "share of demonstration reply tokens the policy predicts"],
  ["rewards/margins", "reward margin (DPO)", "implicit reward of chosen minus rejected"],
  ["rewards/accuracies", "reward accuracy (DPO)", "share of pairs where chosen beats rejected"],
  ["monitor/proxy_reward", "holdout proxy reward (monitor)",
    "mean rule score of holdout replies sampled from the live policy"],
  ["monitor/length", "holdout reply length, chars (monitor)",
    "growth while the proxy stays flat raises a length alarm"],
  ["monitor/pass_at_1", "holdout pass@1 (monitor)", "share of holdout replies that pass the rule"],
  ["monitor/gold", "holdout gold score (monitor)", "the judge's score; proxy up with gold flat is divergence"],
];
