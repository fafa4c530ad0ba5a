"""`python bench/pyspy_threads.py FILE…`: py-spy raw stacks (`record --threads --format raw`) summed per thread.

An aid for reading `bench/gpu_wave.sh profile`'s files, not a serving path. For each thread: its samples and their
share of the file's, then the functions most often on its stack (inclusive). In a `--gil` file a thread's share is
how often it held the GIL; in an `--idle` file, how often it was sampled at all (every thread, every sample), so
its functions say where it ran or waited.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

THREAD_START = ("_bootstrap (threading.py", "_bootstrap_inner (threading.py", "run (threading.py")  # on every stack


def per_thread(lines: list[str]) -> dict[str, tuple[int, collections.Counter]]:
    """{thread: (samples, {frame: samples with it on the stack})} from py-spy's raw lines `thread;frame;… count`."""
    threads: dict[str, tuple[int, collections.Counter]] = {}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        thread, *frames = stack.split(";")
        samples, functions = threads.get(thread, (0, collections.Counter()))
        functions.update(dict.fromkeys(set(frames), int(count)))
        threads[thread] = (samples + int(count), functions)
    return threads


def summary(path: Path, top: int) -> str:
    threads = per_thread(path.read_text().splitlines())
    total = sum(samples for samples, _ in threads.values()) or 1
    out = [f"{path.name}: {total} samples"]
    for thread, (samples, functions) in sorted(threads.items(), key=lambda item: -item[1][0]):
        out.append(f"  {100 * samples / total:5.1f} %  {samples:7d}  {thread}")
        frames = [(frame, n) for frame, n in functions.most_common() if not frame.startswith(THREAD_START)]
        out += [f"           {100 * n / samples:5.1f} %  {frame}" for frame, n in frames[:top]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=12, help="Functions shown per thread.")
    args = parser.parse_args(argv)
    print("\n\n".join(summary(path, args.top) for path in args.files))


if __name__ == "__main__":
    main()
