package etcdtest

import "net/url"

type urlT = url.URL

func mustURL(s string) urlT {
	u, err := url.Parse(s)
	if err != nil {
		panic(err) // only called with literals built above
	}
	return *u
}
