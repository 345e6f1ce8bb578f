"""Where the weight store lives when nobody says otherwise.

The store is shared by every build of a user, so its default home is the per-user cache
folder of the platform: losing it costs only a rebuild, and it stays out of source trees.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENV_VAR = "WEIGHTSTORE_DIR"
APP_NAME = "weightstore"


def resolve_store_path(flag: str | None, recipe_path: Path | None,
                       env: Mapping[str, str] = os.environ) -> Path:
    """Pick the store root: ``--store`` flag > recipe ``store.path`` > ``$WEIGHTSTORE_DIR`` >
    the user's cache folder.

    ``recipe_path`` is taken as given: the recipe loader has already made it absolute
    relative to the recipe file, which the current directory knows nothing about.
    """
    if flag:
        return Path(flag).expanduser().absolute()
    if recipe_path is not None:
        return recipe_path
    value = env.get(ENV_VAR)
    if value:
        return Path(value).expanduser().absolute()
    return user_cache_dir(env)


def add_store_options(parser: Any, store_help: str) -> None:
    """``--store DIR`` or ``--recipe R`` (the store that recipe builds into): one or the
    other, as the command reference says; both at once is a usage error, never a silent
    choice."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--store", help=store_help)
    group.add_argument("--recipe", help="use the store this recipe builds into")


def user_cache_dir(env: Mapping[str, str] = os.environ, platform: str = sys.platform) -> Path:
    """The platform's per-user cache folder for this project."""
    return _user_dir(env, platform, ("LOCALAPPDATA", "Local"), "Caches",
                     ("XDG_CACHE_HOME", ".cache"))


def user_config_dir(env: Mapping[str, str] = os.environ, platform: str = sys.platform) -> Path:
    """The platform's per-user configuration folder for this project (trusted keys)."""
    return _user_dir(env, platform, ("APPDATA", "Roaming"), "Application Support",
                     ("XDG_CONFIG_HOME", ".config"))


def _user_dir(env: Mapping[str, str], platform: str, windows: tuple[str, str], darwin: str,
              xdg: tuple[str, str]) -> Path:
    """Windows: ``%<variable>%`` or ``AppData/<folder>``; macOS: ``Library/<folder>``;
    elsewhere the XDG variable, or ``~/<folder>``."""
    if platform.startswith("win"):
        base = env.get(windows[0])
        if base:
            return Path(base) / APP_NAME
        return _home(env, "USERPROFILE") / "AppData" / windows[1] / APP_NAME
    if platform == "darwin":
        return _home(env, "HOME") / "Library" / darwin / APP_NAME
    value = env.get(xdg[0])
    # The XDG spec says relative values are invalid and must be ignored.
    if value and os.path.isabs(value):
        return Path(value) / APP_NAME
    return _home(env, "HOME") / xdg[1] / APP_NAME


def _home(env: Mapping[str, str], var: str) -> Path:
    value = env.get(var)
    return Path(value) if value else Path.home()
