"""The fix as a pull request (`make pr`, `make pr-verify`).

- `branch.py`: the branch in a local DeepSpeed checkout (`git.py` its git, `blobs.py` the
  committed bytes checked, `fix.py` the fix and the callers at REF, `record.py` pr.json);
- `verify_run.py`: the use case behind pr-verify, wiring the three steps below;
- `verify.py`: the lab's checks per torch (`checks.py`) and the regression test under the
  lab's stand-in harness (`regression.py`);
- `suite.py`: DeepSpeed's own MiCS tests as its CPU CI runs them;
- `affected_range.py`: which releases the bug and the fix reach;
- `description.py`: PR_DESCRIPTION.md; `out_folders.py`: fresh run folders for the steps.
"""
