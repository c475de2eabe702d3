from runner.cli import main

# The guard matters: workers started with the "spawn" method import this module, and must not re-run Hydra.
if __name__ == "__main__":
    main()
