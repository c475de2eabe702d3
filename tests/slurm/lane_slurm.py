import subprocess, sys
print(subprocess.run(["srun", "-n2", "hostname"], capture_output=True, text=True))
