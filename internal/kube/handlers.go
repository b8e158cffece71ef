package kube

import "k8s.io/client-go/tools/cache"

// ChangeHandlers are the informer event handlers of a controller that
// takes an add for a change from nothing: changed(nil, obj) on add,
// changed(old, new) on update, and deleted on delete (nil: deletes are
// not handled).
func ChangeHandlers(changed func(old, new any), deleted func(obj any)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { changed(nil, obj) },
		UpdateFunc: changed,
		DeleteFunc: deleted,
	}
}
