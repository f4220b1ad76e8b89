"""ISSUE.md for the upstream tracker (`make issue`).

- `make.py`: what a results folder (run, survey, bisect) says, rendered and scrubbed;
- `facts.py`: the facts of each kind of folder the issue quotes.
"""
