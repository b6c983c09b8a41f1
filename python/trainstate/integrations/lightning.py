"""A Lightning ``Callback`` that reports the run from every rank.

::

    from trainstate.integrations.lightning import TrainstateCallback
    trainer = Trainer(callbacks=[TrainstateCallback()])

Importable without Lightning (``lightning`` or ``pytorch_lightning``): the
class then derives from ``object``.
"""

from typing import TYPE_CHECKING, Any, Optional

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
    """Joins the run when fitting starts, and reports an exception (or an
    interrupt) that Lightning catches.

    The end of fitting is not the rank's end: a clean end is reported when
    the process ends, with its real outcome. Keyword arguments go to
    :func:`trainstate.init`.
    """

    def __init__(self, **init_kwargs: Any) -> None:
        super().__init__()
        self._init_kwargs = init_kwargs
        self.run: Optional[trainstate.Run] = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.run = trainstate.init(**self._init_kwargs)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # Lightning catches KeyboardInterrupt (and may go on to exit
        # cleanly), so the interrupt is reported here.
        if self.run is not None:
            self.run.fail(exception)
