from omni_cli.cli import main

main()
