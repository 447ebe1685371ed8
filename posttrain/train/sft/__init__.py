"""The SFT recipe: its settings (``settings``), the trainer and ``run_sft`` (``trainer``)."""
