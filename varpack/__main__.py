from varpack.cli import main

main()
