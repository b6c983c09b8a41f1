"""A Hugging Face ``Trainer`` callback that reports the run from every rank.

::

    from trainstate.integrations.huggingface import TrainstateCallback
    trainer = Trainer(model=model, args=args, callbacks=[TrainstateCallback()])

Importable without ``transformers``: the class then derives from ``object``.
"""

import logging
from typing import TYPE_CHECKING, Any, Dict, Optional

import trainstate

if TYPE_CHECKING:
    # Checked without the framework: the callback only adds methods.
    _Base = object
else:
    try:  # pragma: no cover - depends on what is installed
        from transformers import TrainerCallback as _Base
    except Exception:  # not installed, or broken: the callback still imports
        _Base = object


class TrainstateCallback(_Base):
    """Joins the run when training begins, and reports each rank's
    progress: the global step and ``max_steps`` after every step, and the
    scalars the Trainer logs (``loss``, ``learning_rate``, ``eval_loss``...),
    and after each save that progress up to the global step is saved (the
    checkpoint mark, from which a failure's lost work is counted).

    The Trainer calls its callbacks on every process, so every rank
    reports. The end of training is not the rank's end: the rank's end is
    reported when its process ends, with its real outcome (an exception
    raised after ``trainer.train()`` returned errors the run). Keyword
    arguments go to :func:`trainstate.init`.
    """

    def __init__(self, **init_kwargs: Any) -> None:
        self._init_kwargs = init_kwargs
        self.run: Optional[trainstate.Run] = None

    def on_train_begin(self, args: Any = None, state: Any = None, control: Any = None, **kwargs: Any) -> None:
        self.run = trainstate.init(**self._init_kwargs)

    def on_step_end(self, args: Any = None, state: Any = None, control: Any = None, **kwargs: Any) -> None:
        run = self.run
        if run is not None and state is not None:
            max_steps = getattr(state, "max_steps", 0)
            run.report(step=getattr(state, "global_step", None), total_steps=max_steps if max_steps and max_steps > 0 else None)

    def on_save(self, args: Any = None, state: Any = None, control: Any = None, **kwargs: Any) -> None:
        run = self.run
        step = getattr(state, "global_step", None)
        if run is not None and isinstance(step, int):
            try:
                run.report(step=step, checkpoint=step)
            except ValueError as err:  # a step that went back: training goes on without the mark
                logging.getLogger("trainstate").warning("trainstate: %s; the mark is dropped", err)

    def on_log(self, args: Any = None, state: Any = None, control: Any = None, logs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        run = self.run
        if run is not None and logs:
            scalars = {name: value for name, value in logs.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}
            run.report(scalars, step=getattr(state, "global_step", None))
