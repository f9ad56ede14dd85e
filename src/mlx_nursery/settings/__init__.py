"""Server settings: one attrs class, the one place their defaults are stated.

Every field is settable by a flag (`--max-queue`) or `MLX_NURSERY_<FIELD>`; precedence:
command-line flag, then environment variable, then the default here. Sizes and durations
take units in both (`2GiB`, `90s`: _units.py); `none` or `off` unsets an optional one.
Each field's metadata holds its help line and how its default reads (`_fields.py`), so
`mlx-nursery serve --help` is built from it (`_reading.py`) and tests/house/test_settings.py
checks README's options table against it. Defaults the engine has too are read from
EngineConfig, not restated.
"""

from ._fields import Help, SettingsError, Unit
from ._reading import (
    ENV_PREFIX,
    env_name,
    flag_name,
    repeatable,
    setting_help,
    shown_default,
    takes_units,
    value_type,
)
from ._server import LOG_LEVELS, ServerSettings
from ._settings import Settings

__all__ = [
    "ENV_PREFIX",
    "LOG_LEVELS",
    "Help",
    "ServerSettings",
    "Settings",
    "SettingsError",
    "Unit",
    "env_name",
    "flag_name",
    "repeatable",
    "setting_help",
    "shown_default",
    "takes_units",
    "value_type",
]
