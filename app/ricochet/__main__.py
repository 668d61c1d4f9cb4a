from ricochet.cli import main

main()
