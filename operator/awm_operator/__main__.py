"""``python -m awm_operator``: run the operator, configured from the environment."""

from awm_operator.main import run

if __name__ == "__main__":
    run()
