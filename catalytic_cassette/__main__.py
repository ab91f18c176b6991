from catalytic_cassette.cli import main

main()
