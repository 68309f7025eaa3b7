from cmr.cli import main

main()
