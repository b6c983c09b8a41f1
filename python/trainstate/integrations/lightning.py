"""A Lightning ``Callback`` that reports the run from every rank.

::

    from trainstate.integrations.lightning import TrainstateCallback
    trainer = Trainer(callbacks=[TrainstateCallback()])

Importable without Lightning (``lightning`` or ``pytorch_lightning``): the
class then derives from ``object``.
"""

import logging
import time
from typing import TYPE_CHECKING, Any, Dict, Optional

import trainstate

if TYPE_CHECKING:
    # Checked without the framework: the callback only adds methods.
    _Base = object
else:
    try:  # pragma: no cover - depends on what is installed
        from lightning.pytorch.callbacks import Callback as _Base
    except Exception:
        try:
            from pytorch_lightning.callbacks import Callback as _Base
        except Exception:  # neither is installed (or it is broken)
            _Base = object


class TrainstateCallback(_Base):
    """Joins the run when fitting starts, reports each rank's progress (the
    global step and ``max_steps`` after every batch, and the scalars logged
    with ``self.log``, read about once a second), says after each checkpoint
    saved that progress up to the global step is saved (the checkpoint mark,
    from which a failure's lost work is counted), and reports an exception
    (or an interrupt) that Lightning catches.

    The end of fitting is not the rank's end: a clean end is reported when
    the process ends, with its real outcome. Keyword arguments go to
    :func:`trainstate.init`.
    """

    def __init__(self, **init_kwargs: Any) -> None:
        super().__init__()
        self._init_kwargs = init_kwargs
        self.run: Optional[trainstate.Run] = None
        self._metrics_read_at = 0.0

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.run = trainstate.init(**self._init_kwargs)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any = None, batch: Any = None, batch_idx: int = 0) -> None:
        run = self.run
        if run is None:
            return
        max_steps = getattr(trainer, "max_steps", -1)
        metrics: Optional[Dict[str, float]] = None
        now = time.monotonic()
        # Reading a logged tensor's value may wait for the device: not every batch.
        if now - self._metrics_read_at >= 1.0:
            self._metrics_read_at = now
            metrics = _scalars(getattr(trainer, "logged_metrics", None))
        run.report(metrics, step=getattr(trainer, "global_step", None), total_steps=max_steps if max_steps and max_steps > 0 else None)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any = None) -> None:
        run = self.run
        step = getattr(trainer, "global_step", None)
        if run is not None and isinstance(step, int):
            try:
                run.report(step=step, checkpoint=step)
            except ValueError as err:  # a step that went back: training goes on without the mark
                logging.getLogger("trainstate").warning("trainstate: %s; the mark is dropped", err)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.run is not None:
            self.run.report(_scalars(getattr(trainer, "logged_metrics", None)))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # Lightning catches KeyboardInterrupt (and may go on to exit
        # cleanly), so the interrupt is reported here.
        if self.run is not None:
            self.run.fail(exception)


def _scalars(logged: Any) -> Dict[str, float]:
    """The logged values that are one number (plain, or a one-element tensor)."""
    scalars: Dict[str, float] = {}
    if not isinstance(logged, dict):
        return scalars
    for name, value in logged.items():
        if isinstance(value, bool):
            continue
        try:
            if not isinstance(value, (int, float)) and value.numel() != 1:
                continue
            scalars[str(name)] = float(value)
        except Exception:  # noqa: BLE001 - not a number: not a scalar to report
            continue
    return scalars
