"""``pallas-tune``: show, clear, export, import and merge the tuning cache."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence

from pallas._src.tuning.cache import TuningCache


def _show(cache: TuningCache, args) -> int:
    entries = [e for e in cache.entries() if not args.filter or args.filter in e["function"]]
    if args.json:
        print(json.dumps(entries, indent=2, sort_keys=True))
        return 0
    print(f"{cache.path}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
    for e in entries:
        when = datetime.datetime.fromtimestamp(e["created"]).strftime("%Y-%m-%d %H:%M")
        score = "" if e["score"] is None else (
            f"{e['score'] * 1e3:.3f} ms" if e["method"] == "measured" else f"{e['score']:.3g}")
        print(f"- {e['function']}\n    args    {e['signature']}\n    on      {e['device']}"
              f" / {e['backend']}\n    chosen  {json.dumps(e['config'], sort_keys=True)}"
              f"  ({e['method']} {score}, {when})")
    return 0


def _clear(cache: TuningCache, args) -> int:
    n = cache.clear(args.function)
    print(f"removed {n} entr{'y' if n == 1 else 'ies'} from {cache.path}")
    return 0


def _export(cache: TuningCache, args) -> int:
    text = json.dumps(cache.export(), indent=2, sort_keys=True)
    if args.file in (None, "-"):
        print(text)
    else:
        with open(args.file, "w") as fh:
            fh.write(text + "\n")
        print(f"exported {len(cache.entries())} entries to {args.file}", file=sys.stderr)
    return 0


def _import(cache: TuningCache, args) -> int:
    for path in args.files:
        if path == "-":
            counts = cache.import_(json.load(sys.stdin), on_conflict=args.on_conflict)
        else:
            counts = cache.merge(path, on_conflict=args.on_conflict)
        print(f"{path}: {counts['added']} added, {counts['replaced']} replaced, "
              f"{counts['kept']} kept")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pallas-tune", description="The Pallas autotuning cache (pallas.tuning).")
    p.add_argument("--cache", help="the cache file (default: PALLAS_TUNING_CACHE or the "
                   "user cache directory)")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("show", help="list the cached winners")
    s.add_argument("filter", nargs="?", help="only functions whose name contains this")
    s.add_argument("--json", action="store_true", help="as JSON")
    s.set_defaults(run=_show)
    c = sub.add_parser("clear", help="delete cached winners")
    c.add_argument("function", nargs="?", help="only functions whose name contains this")
    c.set_defaults(run=_clear)
    e = sub.add_parser("export", help="write every entry as JSON")
    e.add_argument("file", nargs="?", help="output file (default: stdout)")
    e.set_defaults(run=_export)
    for name, helptext in (("import", "merge JSON exports into the cache"),
                           ("merge", "merge other caches (SQLite files or JSON exports)")):
        i = sub.add_parser(name, help=helptext)
        i.add_argument("files", nargs="+", help="files to merge ('-': JSON on stdin)")
        i.add_argument("--on-conflict", choices=("newer", "replace", "keep"),
                       default="newer", help="for a key in both: keep the later search "
                       "(default), take the imported entry, or keep ours")
        i.set_defaults(run=_import)
    sub.add_parser("path", help="print the cache file's path").set_defaults(
        run=lambda cache, args: print(cache.path) or 0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cache = TuningCache(args.cache)
    try:
        return args.run(cache, args)
    except (ValueError, OSError) as e:
        print(f"pallas-tune: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
