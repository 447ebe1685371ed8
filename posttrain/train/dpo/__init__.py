"""The DPO recipe: its settings (``settings``), the trainer and ``run_dpo`` (``trainer``)."""
