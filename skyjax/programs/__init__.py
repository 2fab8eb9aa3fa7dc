"""skyjax/programs"""
