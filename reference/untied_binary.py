"""Where the reference scripts find the untied binary by default: build/ (the README's build),
then build-cpu/ (a CPU-only build), else `untied` on PATH."""
import os


def default_untied():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    for build in ("build", "build-cpu"):
        path = os.path.join(root, build, "untied")
        if os.path.exists(path):
            return path
    return "untied"
