"""The persistent cache of tuning winners: one SQLite file shared by every process.

It lives in the user cache directory (``$XDG_CACHE_HOME/pallas/tuning.sqlite3``,
``~/Library/Caches/pallas`` on macOS, ``%LOCALAPPDATA%\\pallas\\Cache`` on Windows);
``PALLAS_TUNING_CACHE`` names another file. Concurrent processes are safe: the database
is in WAL mode, every connection waits up to 60 s for a lock, and every write is one
``BEGIN IMMEDIATE`` transaction (an upsert), so no write is lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pallas._src.tuning.keys import CacheKey

ENV_CACHE = "PALLAS_TUNING_CACHE"
FORMAT = "pallas-tuning-cache"  # the "format" field of exports
_KEY_FIELDS = ("function", "signature", "configs", "backend", "device")
_COLUMNS = (*_KEY_FIELDS, "config", "method", "score", "details", "created")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS winners (
  function TEXT NOT NULL, signature TEXT NOT NULL, configs TEXT NOT NULL,
  backend TEXT NOT NULL, device TEXT NOT NULL,
  config TEXT NOT NULL,     -- the winning config, canonical JSON
  method TEXT NOT NULL,     -- "measured" or "model"
  score REAL,               -- median seconds (measured) or the model's estimate
  details TEXT NOT NULL,    -- JSON: every config's median or estimate, pruned reasons
  created REAL NOT NULL,    -- time.time() of the search
  PRIMARY KEY ({", ".join(_KEY_FIELDS)})
)
"""


def user_cache_dir() -> Path:
    """The per-user cache directory for pallas (platformdirs' convention, no dependency)."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "pallas" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "pallas"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pallas"


def default_path() -> Path:
    """``PALLAS_TUNING_CACHE`` if set, else ``tuning.sqlite3`` in :func:`user_cache_dir`."""
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else user_cache_dir() / "tuning.sqlite3"


class TuningCache:
    """The winners table in one SQLite file (created on first write).

    Each method opens its own connection, so one object may be used from any thread or
    forked process.
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_path()

    @contextlib.contextmanager
    def _connect(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        if write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        try:
            con.execute("PRAGMA busy_timeout = 60000")
            if write:
                con.execute("PRAGMA journal_mode = WAL")
                con.execute(_SCHEMA)
            yield con
        finally:
            con.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._connect(write=True) as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def _exists(self) -> bool:
        return self.path.exists()

    def get(self, key: CacheKey) -> dict | None:
        """The entry filed under ``key`` (with ``config`` decoded), or ``None``."""
        if not self._exists():
            return None
        with self._connect(write=False) as con:
            try:
                row = con.execute(
                    f"SELECT {', '.join(_COLUMNS)} FROM winners WHERE "
                    + " AND ".join(f"{f} = ?" for f in _KEY_FIELDS),
                    [getattr(key, f) for f in _KEY_FIELDS]).fetchone()
            except sqlite3.OperationalError as e:
                if "no such table" in str(e):
                    return None
                raise
        return _decode(row) if row else None

    def put(self, key: CacheKey, config: dict, *, method: str, score: float | None,
            details: dict | None = None, created: float | None = None) -> None:
        """Files ``config`` under ``key``, replacing what was there."""
        entry = {**key.as_dict(), "config": config, "method": method, "score": score,
                 "details": details or {}, "created": created or time.time()}
        with self._transaction() as con:
            _upsert(con, entry)

    def entries(self) -> list[dict]:
        """Every entry, decoded, in key order."""
        if not self._exists():
            return []
        with self._connect(write=False) as con:
            try:
                rows = con.execute(f"SELECT {', '.join(_COLUMNS)} FROM winners ORDER BY "
                                   + ", ".join(_KEY_FIELDS)).fetchall()
            except sqlite3.OperationalError as e:
                if "no such table" in str(e):
                    return []
                raise
        return [_decode(r) for r in rows]

    def clear(self, function: str | None = None) -> int:
        """Deletes every entry (or those of functions whose name contains ``function``);
        returns how many."""
        if not self._exists():
            return 0
        with self._transaction() as con:
            if function is None:
                return con.execute("DELETE FROM winners").rowcount
            return con.execute("DELETE FROM winners WHERE instr(function, ?) > 0",
                               [function]).rowcount

    def export(self) -> dict:
        """Every entry as a JSON-ready document (``import_`` reads it back)."""
        return {"format": FORMAT, "version": 1, "entries": self.entries()}

    def import_(self, document: dict | Iterable[dict], *, on_conflict: str = "newer") -> dict:
        """Merges entries from an :meth:`export` document (or another cache's entries).

        ``on_conflict`` decides between an entry here and one imported under the same
        key: ``"newer"`` keeps the later search, ``"replace"`` takes the imported one,
        ``"keep"`` keeps this one. Returns counts: ``added``, ``replaced``, ``kept``.
        """
        if on_conflict not in ("newer", "replace", "keep"):
            raise ValueError(f"import: on_conflict must be 'newer', 'replace' or 'keep', "
                             f"got {on_conflict!r}")
        if isinstance(document, dict):
            if document.get("format") != FORMAT:
                raise ValueError(f"import: not a pallas tuning cache export (format "
                                 f"{document.get('format')!r}, expected {FORMAT!r})")
            entries = document.get("entries", [])
        else:
            entries = list(document)
        counts = {"added": 0, "replaced": 0, "kept": 0}
        with self._transaction() as con:
            for i, e in enumerate(entries):
                missing = [f for f in (*_KEY_FIELDS, "config", "method") if f not in e]
                if missing:
                    raise ValueError(f"import: entry {i} lacks {missing}")
                old = con.execute(
                    "SELECT created FROM winners WHERE "
                    + " AND ".join(f"{f} = ?" for f in _KEY_FIELDS),
                    [e[f] for f in _KEY_FIELDS]).fetchone()
                if old is None:
                    counts["added"] += 1
                elif on_conflict == "keep" or (
                        on_conflict == "newer" and float(e.get("created") or 0) <= old[0]):
                    counts["kept"] += 1
                    continue
                else:
                    counts["replaced"] += 1
                _upsert(con, e)
        return counts

    def merge(self, other: str | os.PathLike, *, on_conflict: str = "newer") -> dict:
        """Merges another cache file (SQLite) or export (JSON) into this one."""
        path = Path(other)
        if path.suffix == ".json":
            return self.import_(json.loads(path.read_text()), on_conflict=on_conflict)
        return self.import_(TuningCache(path).entries(), on_conflict=on_conflict)


def _upsert(con: sqlite3.Connection, e: dict) -> None:
    values = [e[f] for f in _KEY_FIELDS] + [
        json.dumps(e["config"], sort_keys=True, default=repr), e["method"], e.get("score"),
        json.dumps(e.get("details") or {}, sort_keys=True, default=repr),
        float(e.get("created") or time.time())]
    con.execute(
        f"INSERT INTO winners ({', '.join(_COLUMNS)}) VALUES "
        f"({', '.join('?' * len(_COLUMNS))}) ON CONFLICT ({', '.join(_KEY_FIELDS)}) DO "
        "UPDATE SET config = excluded.config, method = excluded.method, "
        "score = excluded.score, details = excluded.details, created = excluded.created",
        values)


def _decode(row: tuple) -> dict[str, Any]:
    e = dict(zip(_COLUMNS, row))
    e["config"] = json.loads(e["config"])
    e["details"] = json.loads(e["details"])
    return e
