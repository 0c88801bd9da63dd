from duragent.cli import main

main()
