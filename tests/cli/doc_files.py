#!/usr/bin/env python3
"""Docs that show a repository file whole keep it in a fenced block whose info string names it:

    ```bash hpc/slurm/sinew-inplace.sbatch
    ...the file, verbatim...
    ```

Checks that every such block of the given Markdown files equals its file (exit 1 and a diff otherwise);
--write fills the blocks from the files instead.

usage: doc_files.py [--write] DOC.md...      (paths relative to the repository root)
"""
import difflib
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```(\w+) (\S+)\n(.*?)^```$", re.M | re.S)


def main():
    args = sys.argv[1:]
    write = "--write" in args
    docs = [a for a in args if a != "--write"]
    if not docs:
        sys.exit(__doc__)
    bad = 0
    for doc in docs:
        path = ROOT / doc
        text = path.read_text()
        blocks = list(BLOCK.finditer(text))
        if not blocks:
            print(f"{doc}: no block names a file")
            bad += 1
        for m in blocks:
            want = (ROOT / m.group(2)).read_text()
            if m.group(3) == want:
                print(f"{doc}: {m.group(2)}: same")
            elif not write:
                bad += 1
                print(f"{doc}: {m.group(2)}: differs from the file (fix with: {sys.argv[0]} --write {doc})")
                sys.stdout.writelines(difflib.unified_diff(
                    m.group(3).splitlines(True), want.splitlines(True), f"{doc}", m.group(2)))
        if write:
            text = BLOCK.sub(lambda m: f"```{m.group(1)} {m.group(2)}\n{(ROOT / m.group(2)).read_text()}```", text)
            path.write_text(text)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
