"""The bundle for maintainers (`make bundle`) and its offline check (`make verify-bundle`).

- `make.py`: the steps, from a results folder to the bundle folder and its archive;
- `image.py`: the run's image flattened and saved (Docker behind one seam);
- `files.py`: scrubbed copies of the run's files, the final leak scan, the sums;
- `manifest.py`: what the bundle promises (the expected outcomes), written last, read first;
- `archive.py`: reading an untrusted bundle archive;
- `verify.py`: the bundle's runs again, from its image alone, against its manifest;
- `comment.py`, `source_refs.py`: ISSUE_COMMENT.md, with DeepSpeed's file and line numbers.
"""
