"""What the recipes train on, prepared from an environment and a policy's graded rows:
preference pairs for DPO (``pairs``) and demonstrations for SFT (``demos``)."""
