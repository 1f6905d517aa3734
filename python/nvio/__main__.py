"""``python -m nvio ARGS``: the bundled ``nvio`` command (see nvio._cli)."""

from nvio._cli import main

if __name__ == "__main__":
    main()
