from graphaudit.cli import main

main()
