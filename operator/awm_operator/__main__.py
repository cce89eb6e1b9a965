"""``python -m awm_operator``: run the operator, configured from the environment."""

import argparse

from awm_operator.main import run

if __name__ == "__main__":
    argparse.ArgumentParser(prog="python -m awm_operator", description=(
        "Run the awm Kubernetes operator (EnvFleets, EnvClaims, Campaigns and the allocation API). "
        "It takes no arguments: it is configured by AWM_* environment variables "
        "(awm_operator/config.py; docs/kubernetes.md).")).parse_args()
    run()
