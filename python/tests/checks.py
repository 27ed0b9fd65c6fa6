"""What the Python tests share: check() records a failure and goes on, raises() checks an
exception and its message, finish() reports and exits 1 when anything failed."""
import sys

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def raises(kind, words, fn, *args, **kwargs):
    """fn(...) raises `kind` whose message contains every word in `words`."""
    try:
        fn(*args, **kwargs)
    except kind as e:
        text = str(e)
        check(all(w in text for w in words), f"{kind.__name__} {text!r} lacks {words}")
        return
    except Exception as e:  # noqa: BLE001: the wrong exception is a failure, not a crash
        check(False, f"expected {kind.__name__} with {words}, got {type(e).__name__}: {e}")
        return
    check(False, f"expected {kind.__name__} with {words}, nothing raised")


def finish():
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
