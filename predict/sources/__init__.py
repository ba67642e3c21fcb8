"""Live metric sources for the watcher (the split into modules follows in the next commit)."""

from predict.sources.wandb import *  # noqa: F401,F403
from predict.sources.wandb import (_BLOCK, _POS_INT, _config_from_update,  # noqa: F401
                                   _history_value, _max_step, _record_dict, _regular,
                                   _step_of, _step_value, _summary_status)
