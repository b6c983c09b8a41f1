// The trainstate page (see issue: web dashboard).
