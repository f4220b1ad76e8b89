"""The command line, `python -m repro COMMAND` (every make target calls it).

Owns the parser and the command registry (main.py, registry.py), the option definitions shared by
several subcommands (options.py), the one place a ReproError becomes a message and an exit code,
and the subcommands as thin handlers grouped by concern: run_commands (list, build, repro,
check-fix, matrix, report, base-image), bisect_commands (bisect, survey, probe),
upstream_commands (bundle, verify-bundle, cluster, pr-regression) and maintenance_commands. An
`argparse.Namespace` never leaves this package: handlers turn it into typed requests.
"""
