"""Callbacks for training frameworks, each a few lines over :func:`trainstate.init`.

- :class:`trainstate.integrations.huggingface.TrainstateCallback` for the
  Hugging Face ``Trainer``;
- :class:`trainstate.integrations.lightning.TrainstateCallback` for
  Lightning's ``Trainer``.

Both import without their framework installed.
"""
