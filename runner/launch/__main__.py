"""`python -m runner.launch OVERRIDES my_script.py ARGS` (also `runner launch ...`): a user's own script on this
machine's processes, like `accelerate launch`."""

from runner.launch.launcher import main

if __name__ == "__main__":
    main()
