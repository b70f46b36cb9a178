"""The configuration file as a source: read once (`load_config`) or served and re-read on change.

`ConfigSource` serves the current configuration and re-reads the file when it changes on disk (a
rotated ConfigMap), keeping the last good configuration when a new version is invalid. The schema
and the parsing are `tfcommon.config`; this module is the file-system side. Reference:
docs/configuration.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from tfcommon.config import ConfigError, TfConfig, parse_config

LOG = logging.getLogger(__name__)


def load_config(path: Path | None) -> TfConfig:
    """Read and validate the file at `path`; `None` means the documented defaults."""
    if path is None:
        return TfConfig()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the configuration file: {error.strerror}") from None
    return parse_config(text, source=str(path))


def _file_signature(path: Path) -> tuple[int, int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_mtime_ns, status.st_size, status.st_ino)


class ConfigSource:
    """The current configuration, re-read when the file changes; thread-safe and cheap to call often.

    `current()` checks the file's signature (mtime, size, inode: a ConfigMap update swaps a symlink)
    at most every `check_interval_s`. An invalid new version is logged and ignored (`last_error`
    says why) until the file is fixed, so a typo never takes a running service down.
    """

    def __init__(self, path: Path | None, *, check_interval_s: float = 1.0) -> None:
        self.path = path
        self.check_interval_s = check_interval_s
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._signature = _file_signature(path) if path is not None else None
        self._config = load_config(path)
        self._next_check = time.monotonic() + check_interval_s

    def current(self) -> TfConfig:
        if self.path is None or time.monotonic() < self._next_check:
            return self._config
        return self.reload_if_changed()

    def reload_if_changed(self) -> TfConfig:
        """Re-read the file now if its signature changed; returns the configuration in force."""
        if self.path is None:
            return self._config
        with self._lock:
            self._next_check = time.monotonic() + self.check_interval_s
            signature = _file_signature(self.path)
            if signature is None or signature == self._signature:
                return self._config
            try:
                config = load_config(self.path)
            except ConfigError as error:
                if self.last_error != str(error):
                    LOG.error("configuration not reloaded, keeping the previous one: %s", error)
                self.last_error = str(error)
                return self._config
            self._signature = signature
            self._config = config
            self.last_error = None
            LOG.info("configuration reloaded from %s", self.path)
            return config
