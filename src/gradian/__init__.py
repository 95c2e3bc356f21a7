"""Gradian: which training examples, or which setting, made a LoRA fine-tune worse at one thing."""

__version__ = "0.1.0"
