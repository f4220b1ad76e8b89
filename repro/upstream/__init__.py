"""Handing the reproduction upstream, to DeepSpeed maintainers and to clusters.

Owns the bundle (bundle.py with bundle_files, bundle_image and bundle_manifest; verify_bundle.py
reruns one offline), the issue comment (issue_comment.py, with source_refs.py for file and line
numbers), scripts for clusters without Docker and the stdlib-only summary script they ship
(cluster.py, cluster_summary.py), the shipped patches (patchgen.py), the DeepSpeed-style PR
regression test (pr_regression.py), scrubbing host details out of everything handed over
(scrub.py) and their Jinja templates (templates/).
"""
