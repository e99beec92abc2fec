"""Kernels kept in a repository, checked and regenerated in CI.

    kernelagent.toml         the manifest: problems, kernels, per-kernel targets (manifest.py)
    kernelagent.lock.json    what the last recorded verification saw (lock.py)
    verify.py                re-evaluate every kernel through the bench store; decide pass/fail
    regenerate.py            run the agent on failing kernels, starting from the current one
    init.py                  write a manifest from folders or from a bench run
    outputs.py               JUnit XML, JSON and the Markdown step summary
"""
